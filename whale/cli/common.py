"""What every command of the CLI shares: the app, the consoles, flags to config fields, the
`--resume` check and one error handler; written once, over `whale.api`.

Exit codes: 0 done; 1 a run that stopped for a cause outside it (what was paid is kept, and
`--resume` continues once it is fixed); 2 a refusal, the message naming the bad value (a
`whale.WhaleError`); 130 Ctrl-C and 143 SIGTERM (what finished is recorded).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import whale.cli.interrupts as interrupts
from whale.errors import RunInterrupted, WhaleError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help=sys.modules["whale.cli"].__doc__)  # fmt: skip
err = Console(stderr=True)
out = Console()
T = TypeVar("T")


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # paths stay whole
    raise typer.Exit(code)


def say(s: str) -> None:
    err.print(f"[cyan]{escape(s)}[/cyan]", soft_wrap=True)


def progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=False)  # fmt: skip


@dataclass(frozen=True)
class Flags:
    """A command's flags as given: `fields` (dotted config field -> value, None left out) for
    the API, and which flag set which field, for the `--resume` check's messages."""

    fields: dict[str, Any]
    named: dict[str, str]  # flag -> field, of the flags given

    @classmethod
    def of(cls, *rows: tuple[str, str, Any]) -> Flags:
        """From (flag, field, value) rows; a value of None was not given."""
        given = [(flag, field, v) for flag, field, v in rows if v is not None]
        return cls({field: v for _, field, v in given}, {flag: field for flag, field, _ in given})


def refuse_on_resume(resume: Path, cls: type, flags: Flags, config: Path | None) -> None:
    """Exit 2 naming every flag given with `--resume` that sets a field the one resume rule
    (`whale.runs.resume`) keeps fixed: the run's config.toml fixes the experiment."""
    from whale.runs.resume import may_change, resumable

    free = resumable(cls)
    named = [flag for flag, field in flags.named.items() if not may_change(free, field)]
    if config is not None:
        named.append("--config")
    if named:
        fail(f"--resume {resume}: {', '.join(named)} cannot be given with --resume (the run's "
             f"config.toml fixes the experiment); these may change: {', '.join(sorted(free))}")


def call(fn: Callable[[], T], again: Callable[[Path], str],
         also: tuple[type[BaseException], ...] = ()) -> T:
    """Run `fn` (an API call) with Ctrl-C and SIGTERM handling, and turn what it raises into
    the CLI's exits: a WhaleError (or an `also` type) exit 2 with its message; a stopped
    search exit 1; an executor lost after the run started exit 2 saying the resume command
    (`again(run_dir)`); Ctrl-C 130 saying what was recorded."""
    from whale.harness.executor import ExecutorUnavailable
    from whale.metaharness.loop import SearchStopped

    restore = interrupts.install()
    try:
        return fn()
    except SearchStopped as e:  # what was paid is kept
        where = f"; `{again(e.run_dir)}` continues once it is fixed" if e.run_dir else ""
        err.print(f"[red]stopped:[/red] {escape(str(e) + where)}", soft_wrap=True)
        raise typer.Exit(1) from None
    except ExecutorUnavailable as e:
        if e.run_dir is None:
            fail(str(e))
        fail(f"executor unavailable: {e}; the rollouts that finished are recorded: "
             f"`{again(e.run_dir)}` continues once it is fixed")  # fmt: skip
    except WhaleError as e:
        fail(str(e))
    except also as e:
        fail(str(e))
    except RunInterrupted as e:
        kept = sum(interrupts.recorded(p) for p in _ledgers(e.run_dir))
        if e.total is not None:  # a run that cannot be resumed (eval) says how far it got
            interrupts.stopped(f"{kept} of {e.total} rollouts recorded in {e.run_dir}")
        interrupts.stopped(f"{kept} rollouts recorded; `{again(e.run_dir)}` continues")
    except KeyboardInterrupt:  # before a run directory existed: nothing was recorded
        interrupts.stopped("stopped before any rollout was recorded")
    finally:
        restore()


def _ledgers(run_dir: Path) -> list[Path]:
    """The ledgers of a run: its own, or its schedules' (cotrain, rsft, diagnose)."""
    own = run_dir / "outcomes.jsonl"
    return [own] if own.exists() else sorted(run_dir.glob("*/outcomes.jsonl"))


# The options every run command has, written once.
CONFIG = typer.Option(None, "--config", help="TOML config file")
RESUME = typer.Option(None, "--resume", help="continue the run in this directory")
UNSAFE = typer.Option(False, "--unsafe-no-sandbox", help="run harnesses WITHOUT isolation")
JSON = typer.Option(False, "--json", help="print one JSON summary")


def set_option(example: str) -> Any:
    return typer.Option([], "--set", help=f"dotted override, e.g. {example}")


PATIENCE = "J_MIN,P_H, e.g. 6,2"


def pair(flag: str, text: str | None, want: str) -> list[int] | None:
    """`--patience 6,2` as [6, 2], or exit 2 saying what is wanted."""
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        fail(f"{flag} {text!r}: want {want}")
