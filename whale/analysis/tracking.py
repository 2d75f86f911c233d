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
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

TrackerKind = Literal["none", "mlflow", "wandb"]
TRACKER_KINDS: tuple[str, ...] = ("none", "mlflow", "wandb")
EXPERIMENT = "whale"
_PARAM_CHARS = 500


class TrackingUnavailable(RuntimeError):
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
            "pip install 'whale[track]' (or set tracking = \"none\")"
        ) from None


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
