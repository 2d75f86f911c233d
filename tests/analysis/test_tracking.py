"""Optional tracking: "none" does nothing, a missing package names the extra, and the MLflow and
W&B adapters make the offline calls (recording fakes here; real MLflow when installed)."""

import os
import sys
import types

import pytest

from whale.analysis.tracking import (
    MlflowTracker,
    NullTracker,
    TrackingUnavailable,
    WandbTracker,
    flatten,
    make_tracker,
    numbers,
    require,
    track_run,
)


def test_none_writes_nothing(tmp_path):
    t = make_tracker("none", tmp_path, "run")
    assert isinstance(t, NullTracker)
    t.log_params({"a": 1})
    t.log_metrics({"accuracy": 0.5}, step=1)
    t.close()
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="known: none, mlflow, wandb"):
        make_tracker("tensorboard", tmp_path, "run")


@pytest.mark.parametrize("kind,module,hint", [("mlflow", "mlflow", r"pip install 'whale\[track\]'"),
                                              ("wandb", "wandb", "pip install wandb")])
def test_a_missing_package_names_the_install(tmp_path, monkeypatch, kind, module, hint):
    monkeypatch.setitem(sys.modules, module, None)  # import of it fails, installed or not
    with pytest.raises(TrackingUnavailable, match=hint):
        make_tracker(kind, tmp_path, "run")
    with pytest.raises(TrackingUnavailable, match=hint):
        require(kind)


def test_params_are_flattened_and_metrics_keep_numbers():
    assert flatten({"a": {"b": 1, "c": {"d": "x"}}, "e": 2}) == {"a.b": 1, "a.c.d": "x", "e": 2}
    got = numbers({"acc": 0.5, "n": 3, "ok": True, "ci": None, "name": "x", "cap": {"r": 0.2}})
    assert got == {"acc": 0.5, "n": 3.0, "ok": 1.0, "cap.r": 0.2}


class FakeMlflowClient:
    made: list["FakeMlflowClient"] = []

    def __init__(self, tracking_uri):
        self.uri, self.calls = tracking_uri, []
        FakeMlflowClient.made.append(self)

    def get_experiment_by_name(self, name):
        self.calls.append(("get_experiment", name))
        return None

    def create_experiment(self, name):
        self.calls.append(("create_experiment", name))
        return "7"

    def create_run(self, exp_id, run_name):
        self.calls.append(("create_run", exp_id, run_name))
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))

    def log_param(self, run_id, k, v):
        self.calls.append(("param", run_id, k, v))

    def log_metric(self, run_id, k, v, step):
        self.calls.append(("metric", run_id, k, v, step))

    def set_terminated(self, run_id):
        self.calls.append(("end", run_id))


def test_mlflow_uses_a_file_store_in_the_run_dir(tmp_path, monkeypatch):
    fake = types.ModuleType("mlflow.tracking")
    fake.MlflowClient = FakeMlflowClient  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlflow", types.ModuleType("mlflow"))
    monkeypatch.setitem(sys.modules, "mlflow.tracking", fake)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # restored after the test
    t = make_tracker("mlflow", tmp_path, "adapt-1")
    assert isinstance(t, MlflowTracker)
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"  # MLflow 3 refuses file stores else
    t.log_params({"select": {"noise_k": 3}})
    t.log_metrics({"accuracy": 0.25, "note": "x"}, step=2)
    t.close()
    t.close()  # once only
    c = FakeMlflowClient.made[-1]
    assert c.uri == f"file://{tmp_path.resolve()}/mlruns"
    assert c.calls[1:] == [("create_experiment", "whale"), ("create_run", "7", "adapt-1"),
                           ("param", "r1", "select.noise_k", "3"),
                           ("metric", "r1", "accuracy", 0.25, 2), ("end", "r1")]  # fmt: skip


def test_wandb_runs_offline_in_the_run_dir(tmp_path, monkeypatch):
    seen: dict = {"log": [], "config": {}, "finished": 0}

    class Run:
        config = types.SimpleNamespace(update=lambda d, allow_val_change: seen["config"].update(d))

        def log(self, metrics, step):
            seen["log"].append((metrics, step))

        def finish(self):
            seen["finished"] += 1

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: (seen.update(init=kw), Run())[1]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    t = make_tracker("wandb", tmp_path / "run", "adapt-1")
    assert isinstance(t, WandbTracker)
    t.log_params({"g": 4})
    t.log_metrics({"accuracy": 0.5, "ci": None}, step=1)
    t.close()
    t.close()
    assert seen["init"] == {"project": "whale", "name": "adapt-1", "dir": str(tmp_path / "run"),
                            "mode": "offline"}  # fmt: skip
    assert seen["config"] == {"g": 4} and seen["log"] == [({"accuracy": 0.5}, 1)]
    assert seen["finished"] == 1


def test_real_mlflow_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    from mlflow.tracking import MlflowClient

    t = make_tracker("mlflow", tmp_path, "real")
    t.log_params({"rounds": 3})
    t.log_metrics({"accuracy": 0.75}, step=1)
    t.close()
    assert (tmp_path / "mlruns").is_dir()
    assert isinstance(t, MlflowTracker)
    run = MlflowClient(tracking_uri=t.uri).get_run(t.run_id)
    assert run.data.params == {"rounds": "3"} and run.data.metrics == {"accuracy": 0.75}


def test_track_run_mirrors_the_reports_curves_into_mlflow(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from tests.analysis.test_report import make_cotrain

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    run = make_cotrain(tmp_path / "run")
    assert track_run("mlflow", run) >= 2
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("whale")
    (mrun,) = client.search_runs([exp.experiment_id])
    assert mrun.data.params["run.kind"] == "cotrain"
    key = next(k for k in mrun.data.metrics if k.startswith("cotrain_ eval accuracy"))
    hist = sorted((m.step, m.value) for m in client.get_metric_history(mrun.info.run_id, key))
    assert hist == [(0, 0.3), (4, 0.6)]  # make_cotrain's reads: (0 rollouts, 0.3), (4, 0.6)


def test_track_run_none_writes_nothing(tmp_path):
    from tests.analysis.test_report import make_cotrain

    run = make_cotrain(tmp_path / "run")
    assert track_run("none", run) == 0 and not (run / "mlruns").exists()


def test_a_command_refuses_an_unavailable_tracker_before_paying(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from whale.cli import app

    monkeypatch.setitem(sys.modules, "wandb", None)
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["adapt", "--task", "rg:basic_arithmetic", "--harness",
                                 "single_call", "--solver", "nope", "--proposer", "nope",
                                 "--set", "tracking=wandb", "--out", str(out)])  # fmt: skip
    assert r.exit_code == 2 and "pip install wandb" in r.output
    assert not out.exists()
