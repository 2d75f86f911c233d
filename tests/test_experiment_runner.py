"""The experiment runner on a fake step (no model): the config file and its scales, the
placeholders and their errors, skipping finished steps, resuming a started one, refusing a
changed config, and the command's exits."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import whale
from whale.cli import app
from whale.config import ConfigError
from whale.experiments import StepChanged, run_experiment
from whale.experiments import runner as runmod
from whale.experiments.records import read_step, whale_commit
from whale.experiments.spec import check_references, load_spec, resolve
from whale.models.base import ModelError, ModelTimeout, ModelUnreachable

EXP = """
name = "demo"
[vars]
model = "m-small"
n = 3
[[steps]]
name = "first"
kind = "evaluate"
model.name = "{vars.model}"
n = "{vars.n}"
[[steps]]
name = "second"
kind = "evaluate"
task.id = "rg:x"
harness = "{first.dir}/harness.py"
n = "{vars.n}"
[scale.toy.vars]
model = "m-toy"
[scale.toy.steps.second]
n = 1
[scale.tiny]
extends = "toy"
vars.n = 2
"""


def write(tmp_path: Path, text: str = EXP) -> Path:
    d = tmp_path / "exp"
    d.mkdir(exist_ok=True)
    (d / "experiment.toml").write_text(text)
    return d


class FakeSteps:
    """Stands in for `run_step`: records each call, can fail at a chosen call."""

    def __init__(self, fail_at: int | None = None, exc: BaseException | None = None) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.fail_at, self.exc = fail_at, exc

    def __call__(self, step, step_dir, fields, say):
        self.calls.append((step.name, fields))
        step_dir.mkdir(parents=True, exist_ok=True)
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise self.exc or KeyboardInterrupt()
        return {"dir": str(step_dir)}


@pytest.fixture
def fake(monkeypatch):
    steps = FakeSteps()
    monkeypatch.setattr(runmod, "run_step", steps)
    return steps


# --- the file and its scales ------------------------------------------------------------------


def test_a_scale_merges_over_the_file_and_extends_another(tmp_path):
    d = write(tmp_path)
    small, toy, tiny = (load_spec(d, s) for s in ("small", "toy", "tiny"))
    assert small.vars == {"model": "m-small", "n": 3} and toy.vars["model"] == "m-toy"
    assert toy.step("second").fields["n"] == 1 and small.step("second").fields["n"] == "{vars.n}"
    assert tiny.vars == {"model": "m-toy", "n": 2} and tiny.step("second").fields["n"] == 1
    assert len({small.sha256, toy.sha256, tiny.sha256}) == 3


@pytest.mark.parametrize(("text", "field"), [
    (EXP.replace('kind = "evaluate"', 'kind = "train"', 1), "steps.first.kind"),
    (EXP.replace('n = "{vars.n}"\n[[steps]]', 'n = 1\nout = "/tmp/x"\n[[steps]]'),
     "steps.first.out"),
    (EXP.replace('name = "second"', 'name = "first"'), "steps.first"),
    (EXP + "[scale.toy.steps.third]\nn = 1\n", "scale.toy.steps.third"),
    (EXP.replace('[scale.tiny]\nextends = "toy"', '[scale.tiny]\nextends = "tiny"'),
     "scale.tiny.extends"),
])  # fmt: skip
def test_a_malformed_experiment_is_a_config_error_naming_the_field(tmp_path, text, field):
    with pytest.raises(ConfigError) as e:
        load_spec(write(tmp_path, text), "tiny")
    assert e.value.field == field


def test_an_unknown_scale_names_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match="known: small, tiny, toy"):
        load_spec(write(tmp_path), "paper")


# --- placeholders -----------------------------------------------------------------------------


def test_a_whole_placeholder_keeps_its_type_and_text_ones_are_written_in(tmp_path):
    spec = load_spec(write(tmp_path))
    got = resolve(spec.step("second"), spec.vars, {"first": {"dir": "/runs/first"}})
    assert got["n"] == 3 and got["harness"] == "/runs/first/harness.py"


def test_an_index_and_escaped_braces(tmp_path):
    text = EXP.replace('task.id = "rg:x"', 'task.id = "{vars.fams[1]}"\ndesc = "{{x}} {vars.n}"')
    text = text.replace("n = 3\n", 'n = 3\nfams = ["rg:a", "rg:b"]\n', 1)
    spec = load_spec(write(tmp_path, text))
    got = resolve(spec.step("second"), spec.vars, {"first": {"dir": "/d"}})
    assert got["task"]["id"] == "rg:b" and got["desc"] == "{x} 3"


@pytest.mark.parametrize(("ref", "says"), [
    ("{vars.nope}", "no var 'nope'"),
    ("{third.dir}", "no step 'third'"),
    ("{second.dir}", "step 'second' runs after 'first'"),
    ("{first.stagewise}", "has no output 'stagewise'"),
    ("{not a ref}", "is not a placeholder"),
])  # fmt: skip
def test_an_unknown_reference_is_an_error_naming_it_and_the_field(tmp_path, ref, says):
    if ref == "{second.dir}":
        where, text = "steps.first.model.name", EXP.replace('"{vars.model}"', f'"{ref}"')
    else:
        where, text = "steps.second.harness", EXP.replace('"{first.dir}/harness.py"', f'"{ref}"')
    with pytest.raises(ConfigError) as e:
        check_references(load_spec(write(tmp_path, text)))
    assert says in str(e.value) and ref in str(e.value) and e.value.field == where


def test_an_index_out_of_range_is_found_when_the_step_resolves(tmp_path):
    text = EXP.replace('task.id = "rg:x"', 'task.id = "{first.dir[3]}"')
    spec = load_spec(write(tmp_path, text))
    check_references(spec)
    with pytest.raises(ConfigError, match=r"\{first.dir\[3\]\}.*has no item 3"):
        resolve(spec.step("second"), spec.vars, {"first": {"dir": ["a"]}})


# --- the runner -------------------------------------------------------------------------------


def test_finished_steps_are_skipped_and_their_outputs_reach_later_steps(tmp_path, fake):
    d, runs = write(tmp_path), tmp_path / "runs"
    got = run_experiment(d, runs)
    assert [a["action"] for a in got.steps] == ["started", "started"]
    root = runs / "demo" / "small"
    assert got.root == root.resolve()
    assert fake.calls[1][1]["harness"] == f"{root.resolve()}/first/harness.py"
    rec = read_step(got.root, "first")
    assert rec is not None and rec.state == "finished" and rec.commits == [whale_commit()]
    again = run_experiment(d, runs)
    assert [a["action"] for a in again.steps] == ["skipped", "skipped"] and len(fake.calls) == 2
    record = json.loads((got.root / "_experiment.json").read_text())
    assert len(record["invocations"]) == 2 and record["config_sha256"] == got.config_sha256


def test_a_scale_runs_in_its_own_folder(tmp_path, fake):
    d, runs = write(tmp_path), tmp_path / "runs"
    run_experiment(d, runs, "toy")
    assert (runs / "demo" / "toy" / "_steps" / "second.json").is_file()
    assert not (runs / "demo" / "small").exists()


def test_an_interrupted_step_stays_started_and_is_resumed(tmp_path, monkeypatch):
    d, runs = write(tmp_path), tmp_path / "runs"
    monkeypatch.setattr(runmod, "run_step", FakeSteps(fail_at=2))
    with pytest.raises(KeyboardInterrupt):
        run_experiment(d, runs)
    root = (runs / "demo" / "small").resolve()
    assert read_step(root, "first").state == "finished"  # type: ignore[union-attr]
    assert read_step(root, "second").state == "started"  # type: ignore[union-attr]
    steps = FakeSteps()
    monkeypatch.setattr(runmod, "run_step", steps)
    got = run_experiment(d, runs)
    assert [a["action"] for a in got.steps] == ["skipped", "resumed"]
    assert [c[0] for c in steps.calls] == ["second"]


def test_a_changed_config_of_a_finished_step_is_refused_naming_step_and_field(tmp_path, fake):
    d, runs = write(tmp_path), tmp_path / "runs"
    run_experiment(d, runs)
    (d / "experiment.toml").write_text(EXP.replace('model = "m-small"', 'model = "m-other"'))
    with pytest.raises(StepChanged) as e:
        run_experiment(d, runs)
    text = " ".join(str(e.value).split())
    assert e.value.field == "steps.first" and "'first'" in text
    assert "fields.model.name was 'm-small', now 'm-other'" in text and "finished" in text
    assert len(fake.calls) == 2


def test_a_changed_config_of_a_started_step_is_refused(tmp_path, monkeypatch):
    d, runs = write(tmp_path), tmp_path / "runs"
    monkeypatch.setattr(runmod, "run_step", FakeSteps(fail_at=2))
    with pytest.raises(KeyboardInterrupt):
        run_experiment(d, runs)
    (d / "experiment.toml").write_text(EXP.replace('task.id = "rg:x"', 'task.id = "rg:y"'))
    steps = FakeSteps()
    monkeypatch.setattr(runmod, "run_step", steps)
    with pytest.raises(
        StepChanged,
        match=r"'second': fields.task.id was 'rg:x', now 'rg:y'.*"
        r"was started",
    ):
        run_experiment(d, runs)
    assert steps.calls == []  # refused before anything ran


def test_a_step_reading_a_folder_that_was_run_anew_is_refused(tmp_path, fake):
    # `second` reads `{first.dir}`: a path, the same after `first` is removed and run again
    # (as StepChanged tells one to), so its hash alone would keep `second`'s results, made
    # from the first `first`'s files, as if they came from the new one.
    import shutil

    d, runs = write(tmp_path), tmp_path / "runs"
    got = run_experiment(d, runs)
    shutil.rmtree(got.root / "first")
    (got.root / "_steps" / "first.json").unlink()
    with pytest.raises(StepChanged) as e:
        run_experiment(d, runs)
    assert e.value.field == "steps.second" and "'first'" in str(e.value)
    assert [c[0] for c in fake.calls] == ["first", "second", "first"]  # second not rerun


def test_a_record_from_before_inputs_were_kept_is_resumed(tmp_path, fake):
    d, runs = write(tmp_path), tmp_path / "runs"
    got = run_experiment(d, runs)
    path = got.root / "_steps" / "second.json"
    old = json.loads(path.read_text())
    old.pop("inputs")
    path.write_text(json.dumps(old))
    again = run_experiment(d, runs)
    assert [a["action"] for a in again.steps] == ["skipped", "skipped"]
    assert read_step(got.root, "second").inputs  # type: ignore[union-attr]


def test_a_step_whose_folder_moved_with_its_records_keeps_its_hash(tmp_path, fake):
    d = write(tmp_path)
    run_experiment(d, tmp_path / "runs")
    (tmp_path / "runs").rename(tmp_path / "moved")
    got = run_experiment(d, tmp_path / "moved")
    assert [a["action"] for a in got.steps] == ["skipped", "skipped"]


# --- the command ------------------------------------------------------------------------------


def test_the_command_prints_json_and_a_bad_reference_exits_2(tmp_path, fake):
    d = write(tmp_path)
    r = CliRunner().invoke(app, ["experiment", "run", str(d), "--runs", str(tmp_path / "r"),
                                 "--json"], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["experiment"] == "demo" and [s["step"] for s in out["steps"]] == ["first", "second"]
    bad = write(tmp_path, EXP.replace('"{vars.model}"', '"{vars.modle}"'))
    r2 = CliRunner().invoke(app, ["experiment", "run", str(bad), "--runs", str(tmp_path / "r2")])
    assert r2.exit_code == 2 and "no var 'modle'" in r2.output


def test_ctrl_c_exits_130_and_says_how_to_continue(tmp_path, monkeypatch):
    from whale.errors import RunInterrupted

    d = write(tmp_path)
    monkeypatch.setattr(
        runmod, "run_step", FakeSteps(fail_at=1, exc=RunInterrupted(tmp_path / "x"))
    )
    r = CliRunner().invoke(app, ["experiment", "run", str(d), "--runs", str(tmp_path / "r"),
                                 "--scale", "toy"])  # fmt: skip
    assert r.exit_code == 130
    assert f"whale experiment run {d} --scale toy --runs {tmp_path / 'r'}" in \
        " ".join(r.output.split())  # fmt: skip
    monkeypatch.setattr(
        runmod, "run_step", FakeSteps(fail_at=1, exc=RunInterrupted(tmp_path / "x"))
    )
    r = CliRunner().invoke(app, ["experiment", "run", str(d), "--runs", str(tmp_path / "r"),
                                 "--scale", "toy", "--retries", "5"])  # fmt: skip
    assert r.exit_code == 130 and "--retries 5" in " ".join(r.output.split())


# --- train-proposer evaluate on a directory of its own (the format step) ------------------------


def test_evaluate_of_trained_stages_on_a_new_directory_needs_trained_from(tmp_path):
    fields = {"families": {"eval": ["rg:lcm"]}, "evaluate": {"subject": "grpo"}}
    with pytest.raises(whale.WhaleError) as e:
        whale.train_proposer("evaluate", tmp_path / "new", fields=fields)
    assert e.value.field == "run" and "trained_from" in str(e.value)
    with pytest.raises(whale.WhaleError) as e2:  # a run with no grpo adapter
        whale.train_proposer("evaluate", tmp_path / "new", fields=fields, trained_from=tmp_path)
    assert e2.value.field == "trained_from" and "no grpo adapter" in str(e2.value)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "other.txt").write_text("x")
    with pytest.raises(whale.WhaleError) as e3:
        whale.train_proposer("evaluate", tmp_path / "full",
                             fields={**fields, "evaluate": {"subject": "base",
                                                            "against": ["teacher"]}})  # fmt: skip
    assert e3.value.field == "run" and "not empty" in str(e3.value)
    assert not (tmp_path / "new").exists()  # refused before anything was made


def test_trained_from_is_for_evaluate_only(tmp_path):
    with pytest.raises(ConfigError) as e:
        whale.train_proposer("sft", tmp_path / "run", trained_from=tmp_path)
    assert e.value.field == "trained_from" and not (tmp_path / "run").exists()


def test_the_adapters_are_copied_once_and_a_resume_must_name_the_same_run(tmp_path):
    from whale.models import PROPOSER_MARKER
    from whale.runs.trained import copy_adapters

    for run in ("a", "b"):
        adapter = tmp_path / run / "grpo" / "adapter"
        adapter.mkdir(parents=True)
        (adapter / PROPOSER_MARKER).write_text(run)
    dest = tmp_path / "eval"
    dest.mkdir()
    assert copy_adapters(tmp_path / "a", dest)["stages"] == ["grpo"]
    assert (dest / "grpo" / "adapter" / PROPOSER_MARKER).read_text() == "a"
    assert not (dest / "sft").exists()
    copy_adapters(tmp_path / "a", dest)  # a resume from the same run
    with pytest.raises(whale.WhaleError) as e:
        copy_adapters(tmp_path / "b", dest)
    assert e.value.field == "trained_from"
    (tmp_path / "b" / "config.toml").write_text("")  # a run that trained its own
    with pytest.raises(whale.WhaleError, match="a run of its own"):
        copy_adapters(tmp_path / "a", tmp_path / "b")


# --- the two experiments' files ----------------------------------------------------------------


@pytest.mark.parametrize("experiment", ["harness-learning", "whale"])
@pytest.mark.parametrize("scale", ["small", "toy", "paper"])
def test_every_step_of_every_scale_builds_its_kinds_config(experiment, scale):
    """A typo in a field of the last step is found now, not hours into a run: each step's
    fields, with plausible outputs of the steps before it, build the kind's checked config."""
    from whale import config as cfgmod
    from whale.analysis.diagnose import DiagnoseConfig
    from whale.experiments.select import SelectConfig
    from whale.schedule.cotrain import CotrainConfig
    from whale.train.proposer.run import ProposerTrainConfig

    kinds = {"select": SelectConfig, "diagnose": DiagnoseConfig, "cotrain": CotrainConfig,
             "train_proposer": ProposerTrainConfig}  # fmt: skip
    fams = ["rg:basic_arithmetic", "rg:count_bits", "rg:leg_counting", "rg:lcm"]
    spec = load_spec(Path(__file__).parents[1] / "experiments" / experiment, scale)
    check_references(spec)
    outputs: dict[str, dict] = {}
    for step in spec.steps:
        fields = resolve(step, spec.vars, outputs)
        fields.pop("trained_from", None)
        cfgmod.build(kinds[step.kind], fields)
        lists = {n: fams[i : i + 1] for i, n in enumerate(fields.get("lists", {}))}
        outputs[step.name] = {"dir": f"/runs/{step.name}", "stagewise": [0.5, 2], **lists,
                              **{f"{n}_format": v for n, v in lists.items()}}  # fmt: skip


def test_a_running_steps_wall_time_reaches_its_record_before_it_ends(tmp_path, monkeypatch):
    """A runner killed outright (a session's end: SIGKILL) writes nothing more: the time its
    step ran must already be on disk, to within a heartbeat."""
    import time

    d, runs = write(tmp_path), tmp_path / "runs"
    monkeypatch.setattr(runmod, "HEARTBEAT_S", 0.05)
    seen: list[tuple[str, float]] = []

    since = [time.monotonic()]  # before the step's clock started: the last step's end

    def slow_step(step, step_dir, fields, say):
        # The step at work: what a SIGKILL now would leave on disk, read until it shows at
        # least 0.3 s (a heartbeat wakes late on a loaded machine: no bound on when, only a
        # deadline), and never more than the time since the step could have started.
        step_dir.mkdir(parents=True, exist_ok=True)
        while time.monotonic() - since[0] < 30:
            time.sleep(0.02)
            rec = read_step((runs / "demo" / "small").resolve(), step.name)
            if rec is not None and rec.wall_s >= 0.3:
                seen.append((rec.state, rec.wall_s, time.monotonic() - since[0]))
                break
        since[0] = time.monotonic()
        return {"dir": str(step_dir)}

    monkeypatch.setattr(runmod, "run_step", slow_step)
    run_experiment(d, runs)
    assert [s for s, _, _ in seen] == ["started", "started"], seen
    assert all(w <= ran + 0.05 for _, w, ran in seen), seen  # not more than run (rounded to 0.1 s)
    final = read_step((runs / "demo" / "small").resolve(), "first")
    assert final.state == "finished" and final.wall_s >= 0.3  # type: ignore[union-attr]


# --- transient model errors ---------------------------------------------------------------------


def _transient_fake(monkeypatch, fail_at: set[int], exc: BaseException) -> list[str]:
    calls: list[str] = []

    def run_step(step, step_dir, fields, say):
        calls.append(step.name)
        step_dir.mkdir(parents=True, exist_ok=True)
        if len(calls) in fail_at:
            raise exc
        return {"dir": str(step_dir)}

    monkeypatch.setattr(runmod, "run_step", run_step)
    monkeypatch.setattr(runmod, "RETRY_PAUSE_S", 0.0)
    return calls


def test_a_step_stopped_by_a_model_timeout_is_resumed_and_the_stop_recorded(tmp_path, monkeypatch):
    """Issue 26's run lost its GRPO step to one call that got no reply in 600 s on a busy
    machine: the step is resumed in the same invocation, and its record keeps the stop."""
    calls = _transient_fake(monkeypatch, {1}, ModelTimeout("m at x: no reply within 600.0 s"))
    said: list[str] = []
    exp = run_experiment(write(tmp_path), tmp_path / "runs", say=said.append)
    assert calls == ["first", "first", "second"]
    rec = read_step(exp.root, "first")
    assert rec.state == "finished" and len(rec.transient) == 1
    assert "ModelTimeout" in rec.transient[0] and any("resumed in" in s for s in said)


def test_a_wrapped_unreachable_server_counts_and_retries_run_out(tmp_path, monkeypatch):
    try:
        try:
            raise ModelUnreachable("cannot reach the model server")
        except ModelUnreachable as inner:
            raise RuntimeError("the proposer step failed") from inner
    except RuntimeError as e:
        wrapped = e
    calls = _transient_fake(monkeypatch, {1, 2, 3}, wrapped)
    with pytest.raises(RuntimeError, match="proposer step failed"):
        run_experiment(write(tmp_path), tmp_path / "runs", retries=2)
    assert calls == ["first"] * 3
    assert len(read_step(tmp_path / "runs" / "demo" / "small", "first").transient) == 2


@pytest.mark.parametrize("exc", [ValueError("a wrong config"), ModelError("HTTP 400")])
def test_any_other_error_stops_the_runner_at_once(tmp_path, monkeypatch, exc):
    calls = _transient_fake(monkeypatch, {1}, exc)
    with pytest.raises(type(exc)):
        run_experiment(write(tmp_path), tmp_path / "runs")
    assert calls == ["first"]


def test_the_command_passes_retries_and_refuses_a_negative_count(tmp_path, monkeypatch):
    calls = _transient_fake(monkeypatch, {1}, ModelTimeout("no reply"))
    r = CliRunner().invoke(app, ["experiment", "run", str(write(tmp_path)), "--runs",
                                 str(tmp_path / "runs"), "--retries", "0"])  # fmt: skip
    assert r.exit_code != 0 and calls == ["first"]
    r = CliRunner().invoke(app, ["experiment", "run", str(write(tmp_path)), "--retries", "-1"])
    assert r.exit_code == 2


def test_an_error_raised_from_none_over_a_transient_one_is_not_retried(tmp_path, monkeypatch):
    """`raise X from None` says X is not about the error it was raised during (an embedded
    server that died under a call is a ModelError "from None" over the ModelUnreachable the
    call saw): as Python's own traceback does, the runner does not look behind it."""
    try:
        try:
            raise ModelUnreachable("cannot reach the model server at http://127.0.0.1:1")
        except ModelUnreachable:
            raise ModelError("llama.cpp server exited (-9) during the call") from None
    except ModelError as e:
        suppressed = e
    calls = _transient_fake(monkeypatch, {1}, suppressed)
    with pytest.raises(ModelError, match="exited"):
        run_experiment(write(tmp_path), tmp_path / "runs")
    assert calls == ["first"]
    assert read_step(tmp_path / "runs" / "demo" / "small", "first").transient == []


def test_ctrl_c_in_the_retry_pause_is_a_run_interrupted_naming_the_step(tmp_path, monkeypatch):
    """The pause is part of the step: Ctrl-C there exits 130 saying how to continue, like
    Ctrl-C in the step, not "stopped before any rollout was recorded"."""
    from whale.errors import RunInterrupted

    calls = _transient_fake(monkeypatch, {1, 2}, ModelTimeout("no reply"))  # API, then CLI

    def ctrl_c(_: float) -> None:
        raise KeyboardInterrupt

    # the runner's own time.sleep only (subprocess waits through the module's sleep)
    monkeypatch.setattr(runmod, "time", SimpleNamespace(sleep=ctrl_c, monotonic=time.monotonic))
    with pytest.raises(RunInterrupted) as e:
        run_experiment(write(tmp_path), tmp_path / "runs")
    assert e.value.run_dir == tmp_path / "runs" / "demo" / "small" / "first"
    d = write(tmp_path)
    r = CliRunner().invoke(app, ["experiment", "run", str(d), "--runs", str(tmp_path / "r")])
    assert r.exit_code == 130 and "before any rollout" not in r.output
    assert f"whale experiment run {d} --scale small --runs {tmp_path / 'r'}" in \
        " ".join(r.output.split())  # fmt: skip
    assert calls == ["first", "first"]


class _Unprintable(RuntimeError):
    def __str__(self) -> str:
        raise ValueError("str() of this error fails")


def test_the_record_names_the_transient_error_and_a_bad_message_does_not_end_the_run(
        tmp_path, monkeypatch):  # fmt: skip
    """The record keeps the transient error of the chain (a wrapper's message alone does not
    say it was a timeout); an enormous message is cut, and one whose str() raises is named."""
    try:
        try:
            raise ModelUnreachable("cannot reach the model server " + "x" * 100_000)
        except ModelUnreachable as inner:
            raise _Unprintable() from inner
    except RuntimeError as e:
        wrapped = e
    _transient_fake(monkeypatch, {1}, wrapped)
    said: list[str] = []
    exp = run_experiment(write(tmp_path), tmp_path / "runs", say=said.append)
    rec = read_step(exp.root, "first")
    assert rec.state == "finished" and len(rec.transient) == 1  # type: ignore[union-attr]
    assert "ModelUnreachable: cannot reach" in rec.transient[0]  # type: ignore[union-attr]
    assert len(rec.transient[0]) < 1000 and max(map(len, said)) < 2000  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [[1, 2], [{"at": "x"}], [None]])
def test_a_transient_list_that_is_not_strings_is_not_a_step_record(tmp_path, fake, bad):
    from whale.records import RecordError

    exp = run_experiment(write(tmp_path), tmp_path / "runs")
    path = exp.root / "_steps" / "first.json"
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "transient": bad}))
    with pytest.raises(RecordError, match="not a step record"):
        read_step(exp.root, "first")


def test_a_record_without_transient_stops_is_readable_by_a_whale_from_before_them(
        tmp_path, fake):  # fmt: skip
    """A whale before 333f8e1 builds StepRecord(**raw) and refuses any key it does not know:
    a step no transient error stopped is written without the key, so it still reads there."""
    exp = run_experiment(write(tmp_path), tmp_path / "runs")
    raw = json.loads((exp.root / "_steps" / "first.json").read_text())
    assert "transient" not in raw
    assert read_step(exp.root, "first").transient == []  # type: ignore[union-attr]


@pytest.mark.parametrize("scale", ["small", "paper"])
def test_whale_s_cycles_let_weight_only_spend_its_budget(scale):
    # `cycles` caps every schedule: set for the small budget, a paper-scale run inheriting it
    # would stop weight-only at 38,400 of 200,000 rollouts.
    import math

    from whale.experiments.spec import load_spec

    steps = [st for st in load_spec(Path("experiments/whale"), scale).steps
             if st.kind == "cotrain"]  # fmt: skip
    assert steps
    for st in steps:
        f = st.fields
        g, step_epochs = (f.get("rsft") or {}).get("g", 4), 0.05
        per_step = max(1, round(step_epochs * f["train"]))
        steps_per_phase = math.ceil(f["weight_epochs"] / (per_step / f["train"]) - 1e-9)
        assert f["cycles"] * steps_per_phase * per_step * g >= f["rollouts"], st.name
