"""`whale index build`: a BM25 index (bm25s) over a passage corpus."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from whale.cli.common import app, fail, progress

index_app = typer.Typer(no_args_is_help=True, help="Build BM25 indexes over passage corpora.")
app.add_typer(index_app, name="index")


@index_app.command("build")
def index_build(
    corpus: Path = typer.Argument(..., help="JSONL of {id, title, text}"),
    out_dir: Path = typer.Option(..., "--out", help="index directory"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Build a BM25 index (bm25s, stemmed) of a corpus and save it, with the corpus hash."""
    from whale.retrieval import BM25Index, read_corpus

    try:
        passages = read_corpus(corpus)
    except (OSError, ValueError) as e:
        fail(str(e))
    t0 = time.monotonic()
    with progress() as bar:
        tid = bar.add_task(f"index {len(passages)} passages", total=2)
        index = BM25Index.build(
            passages, progress=lambda done, total: bar.update(tid, completed=done)
        )
        index.save(out_dir)
    info = {
        "passages": len(index),
        "corpus_hash": index.corpus_hash,
        "out": str(out_dir),
        "seconds": round(time.monotonic() - t0, 2),
    }
    print(json.dumps(info) if as_json else f"indexed {info['passages']} passages into {out_dir}")
