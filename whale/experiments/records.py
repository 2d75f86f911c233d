"""What the experiment runner records beside the steps' run directories, in ROOT/<name>/<scale>/:

- `_steps/<step>.json`: one record per step: its kind, the hash of its resolved config and the
  config itself (the scale's run folder written as `<runs>`), `started` or `finished`, the
  whale commits it ran under, its wall time summed over invocations, its outputs (what
  later steps' placeholders read), and which run of each earlier step whose folder it reads
  it read (`inputs`);
- `_experiment.json`: the experiment's name, scale and config file, and one row per
  invocation of the runner: when, the whale commit, the hash of the whole scale-resolved
  config.

Step names match [a-z0-9][a-z0-9_-]*, so no step's folder is one of these. Records are
written whole or not at all (`whale.records.write_atomic`) and read as untrusted
(RecordError naming the file).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from whale.records import RecordError, read_json, record_dir, write_atomic

STEPS_DIR = "_steps"
EXPERIMENT = "_experiment.json"
STATES = ("started", "finished")


@dataclass
class StepRecord:
    step: str
    kind: str
    hash: str
    config: dict[str, Any]
    state: str = "started"
    commits: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    outputs: dict[str, Any] = field(default_factory=dict)
    started_at: str = ""
    finished_at: str | None = None
    run_id: str = ""  # made when the step is first started: a step run anew has another
    # step -> identity (`identity`) of each earlier step whose folder it reads ("{STEP.dir}"),
    # as they were when it started: a path is the same after that step was run anew
    inputs: dict[str, str] = field(default_factory=dict)
    # each transient model error that stopped the step and after which it was resumed (runner)
    transient: list[str] = field(default_factory=list)


def identity(rec: StepRecord) -> str:
    """Which run of a step `rec` records: its config hash and when it was first started."""
    return f"{rec.hash}:{rec.run_id or rec.started_at}"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def step_path(root: Path, name: str) -> Path:
    return root / STEPS_DIR / f"{name}.json"


def read_step(root: Path, name: str) -> StepRecord | None:
    path = step_path(root, name)
    if not path.exists():
        return None
    raw = read_json(path)
    try:
        rec = StepRecord(**raw)
    except TypeError as e:
        raise RecordError(f"{path}: not a step record ({e})") from None
    if rec.state not in STATES or rec.step != name or not isinstance(rec.config, dict) or \
            not isinstance(rec.outputs, dict) or not isinstance(rec.inputs, dict) or \
            not isinstance(rec.transient, list) or \
            not all(isinstance(t, str) for t in rec.transient):  # fmt: skip
        raise RecordError(f"{path}: not a step record of {name!r}")
    return rec


def write_step(root: Path, rec: StepRecord) -> None:
    """Write `rec`; `transient` only when a step was stopped so: a whale from before the field
    (StepRecord(**raw) refuses a key it does not know) still reads every other record."""
    record_dir(root / STEPS_DIR)
    raw = asdict(rec)
    if not raw["transient"]:
        del raw["transient"]
    write_atomic(step_path(root, rec.step), json.dumps(raw, indent=1, default=str))


def note_invocation(root: Path, name: str, scale: str, source: Path, sha256: str) -> None:
    """Append this invocation (time, commit, config hash) to `_experiment.json`."""
    path = root / EXPERIMENT
    prior = read_json(path) if path.exists() else {}
    if not isinstance(prior, dict) or not isinstance(prior.get("invocations", []), list):
        raise RecordError(f"{path}: not an experiment record")
    rows = prior.get("invocations", [])
    rows.append({"at": now(), "commit": whale_commit(), "config_sha256": sha256})
    rec = {"experiment": name, "scale": scale, "source": str(source), "config_sha256": sha256,
           "invocations": rows}  # fmt: skip
    write_atomic(path, json.dumps(rec, indent=1))


def read_experiment(root: Path) -> dict[str, Any]:
    path = root / EXPERIMENT
    rec = read_json(path)
    if not isinstance(rec, dict) or not isinstance(rec.get("config_sha256"), str):
        raise RecordError(f"{path}: not an experiment record")
    return rec


def whale_commit() -> str:
    """`git rev-parse HEAD` of the checkout whale is imported from (with `+dirty` when a
    tracked file differs from it); "unknown" outside a checkout of whale."""
    top = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(top), *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()  # fmt: skip

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != top:
            return "unknown"  # whale installed inside some other repository
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head
