"""Optional experiment tracking (MLflow or Weights & Biases), offline, off by default.

A run directory already holds every record a report needs; a tracker only mirrors params and
metrics into a tool some people browse runs with. Nothing leaves the machine:

- `mlflow`: a file store inside the run directory (tracking URI `file:<RUN_DIR>/mlruns`,
  experiment "whale", one MLflow run named `name`), through `MlflowClient`, so no process-wide
  MLflow state is touched. MLflow 3 refuses a file store unless MLFLOW_ALLOW_FILE_STORE is
  true: the tracker sets it to true when it is unset (a file store is what keeps the run
  directory self-contained, with no database package); set it to false to get MLflow's
  refusal. Browse with `MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri
  <RUN_DIR>/mlruns`.
- `wandb`: `wandb.init(mode="offline", dir=RUN_DIR)` (files under RUN_DIR/wandb); `wandb sync`
  uploads them later, if ever.
- `none`: does nothing (the default).

The packages are imported only by `make_tracker`, and only for their kind; a missing one is a
`TrackingUnavailable` naming `pip install 'whale[track]'`. Params are flattened to dotted keys
(nested dicts) and logged as strings (MLflow keeps params as text; values past 500 characters
are cut there). Metrics keep numbers only: None, strings and other values are not logged, and a
bool is logged as 0/1. Not covered: artifacts (curves, harnesses: the report embeds those) and
resuming a tracker run (a resumed whale run opens a new tracker run).
"""

from __future__ import annotations

import importlib
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from whale.config import TrackerKind
from whale.errors import WhaleError

TRACKER_KINDS: tuple[TrackerKind, ...] = typing.get_args(TrackerKind)
EXPERIMENT = "whale"
_PARAM_CHARS = 500


class TrackingUnavailable(WhaleError, RuntimeError):
    """The tracking package of the chosen kind is not installed."""


class Tracker(Protocol):
    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


def numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics a tracker takes: flattened, numbers only (bool as 0/1)."""
    return {k: float(v) for k, v in flatten(metrics).items()
            if isinstance(v, int | float)}  # fmt: skip


class NullTracker:
    """kind "none": every call does nothing."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class MlflowTracker:
    """One MLflow run in the file store `<run_dir>/mlruns`."""

    def __init__(self, mlflow_tracking: Any, run_dir: Path, name: str) -> None:
        self.uri = (run_dir / "mlruns").resolve().as_uri()
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow >= 3 (see above)
        self.client = mlflow_tracking.MlflowClient(tracking_uri=self.uri)
        exp = self.client.get_experiment_by_name(EXPERIMENT)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(EXPERIMENT)
        self.run_id: str = self.client.create_run(exp_id, run_name=name).info.run_id
        self._closed = False

    def log_params(self, params: Mapping[str, Any]) -> None:
        for k, v in flatten(params).items():
            self.client.log_param(self.run_id, k, str(v)[:_PARAM_CHARS])

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        for k, v in numbers(metrics).items():
            self.client.log_metric(self.run_id, k, v, step=step)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.set_terminated(self.run_id)


class WandbTracker:
    """One offline W&B run under `<run_dir>/wandb`."""

    def __init__(self, wandb: Any, run_dir: Path, name: str) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=EXPERIMENT, name=name, dir=str(run_dir), mode="offline")
        self._closed = False

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.run.config.update(flatten(params), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(numbers(metrics), step=step)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.run.finish()


def _import(module: str, kind: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrackingUnavailable(
            f"tracking = {kind!r} needs the {kind} package, which is not installed ({e}): "
            + ("pip install 'whale[track]'" if kind == "mlflow" else "pip install wandb")
            + ' (or set tracking = "none")'
        ) from None


def require(kind: str) -> None:
    """Raise TrackingUnavailable now, before a run starts, when `kind`'s package is missing
    (and ValueError for an unknown kind): a run must not pay for its rollouts and then find
    out it cannot be mirrored."""
    if kind == "none":
        return
    if kind not in TRACKER_KINDS:
        raise ValueError(f"unknown tracking kind {kind!r}; known: {', '.join(TRACKER_KINDS)}")
    _import("mlflow.tracking" if kind == "mlflow" else "wandb", kind)


def make_tracker(kind: str, run_dir: Path, name: str) -> Tracker:
    """The tracker of `kind` for the run in `run_dir`; ValueError for an unknown kind,
    TrackingUnavailable when its package is missing."""
    if kind == "none":
        return NullTracker()
    if kind == "mlflow":
        return MlflowTracker(_import("mlflow.tracking", kind), run_dir, name)
    if kind == "wandb":
        return WandbTracker(_import("wandb", kind), run_dir, name)
    raise ValueError(f"unknown tracking kind {kind!r}; known: {', '.join(TRACKER_KINDS)}")


def _metric_key(*parts: str) -> str:
    """MLflow and W&B accept letters, digits, `_-./ `; anything else (hostile titles) is `_`."""
    key = "/".join(parts)
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)[:250]


def track_run(kind: str, run_dir: Path, name: str | None = None) -> int:
    """Mirror a finished run's records into a tracker of `kind`: the config as params, and every
    point of every curve the report draws (`whale.analysis.report_runs.load_run`: eval accuracy
    against training rollouts, per-round and per-iteration scores, weight-step rewards, GRPO
    rewards) as a metric with the point's x as its step. The mirror reads the same records as
    the report, after the run, so a tracker can never disagree with the run directory and a
    broken tracker cannot break a run; the cost is that nothing is live while the run is going.
    Returns the number of metric points logged; 0 and no tracker run for kind "none"."""
    if kind == "none":
        return 0
    from whale.analysis.report_runs import load_run

    data = load_run(run_dir)
    tracker = make_tracker(kind, run_dir, name or run_dir.name)
    logged = 0
    try:
        tracker.log_params({"run.kind": data.kind, **dict(data.config)})
        for curve in data.curves:
            for series, points in curve.series.items():
                key = _metric_key(curve.title, series)
                for x, y in points:
                    tracker.log_metrics({key: y}, step=int(x))
                    logged += 1
    finally:
        tracker.close()
    return logged
