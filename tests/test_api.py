"""The public Python API (`whale.api`): runs from Python with task and model objects, resumes
from Python and from the CLI, and refuses with typed errors naming the field, never an exit."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import whale
from tests.fakes import ScriptedModel
from tests.revise.conftest import GOOD_EDIT, SEED, SumTask, prose_solver
from whale.cli import app
from whale.config import ConfigError
from whale.models import UnknownModel
from whale.records import RecordError, RunDirInUse
from whale.runs import OutNotADirectory, ResumeMismatch, RunDirNotEmpty
from whale.runs.setup import HarnessUnavailable, SplitRefused, TaskUnavailable
from whale.tasks import UnknownTask

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"rounds": 1, "g": 2, "dev": 6, "eval": 6, "feedback": 3, "workers": 2}


def small_adapt(out: Path, **kw):
    args = {"task": SumTask(), "harness": SEED, "solver": prose_solver(),
            "proposer": ScriptedModel([GOOD_EDIT]), "out": out, **SMALL, **kw}  # fmt: skip
    return whale.adapt(**args)


# --- runs -------------------------------------------------------------------------------------


def test_evaluate_with_objects_returns_the_reading_and_records_the_run(tmp_path):
    run = whale.evaluate(SumTask(), SEED, ScriptedModel(["7"]), n=5, out=tmp_path / "e")
    assert run.kind == "eval" and run.run_dir == tmp_path / "e"
    assert run.held_out["harness"].n == 5 and len(run.outcomes) == 5
    assert run.held_out["harness"].correct == sum(o.correct for o in run.outcomes)
    assert json.loads((run.run_dir / "summary.json").read_text())["n"] == 5
    assert (run.run_dir / "harness.py").read_text() == SEED


def test_adapt_from_python_keeps_the_fix_and_reads_the_held_out_split(tmp_path):
    run = small_adapt(tmp_path / "a")
    assert run.held_out["seed"].correct == 0 and run.held_out["final"].correct == 6
    assert "re.findall" in (run.harness or "")  # the final harness is the edited source
    assert run.records["task"].startswith("object:test:sum@")  # an object, named as one
    assert (run.run_dir / "summary.md").exists()


def test_a_python_run_resumes_from_python_and_from_the_cli_paying_nothing_twice(tmp_path):
    first = small_adapt(tmp_path / "a")
    again = whale.adapt(SumTask(), SEED, prose_solver(), ScriptedModel([GOOD_EDIT]),
                        resume=first.run_dir)  # fmt: skip
    assert again.records["rollouts_paid_this_invocation"] == 0
    assert again.held_out == first.held_out
    # the same directory from the CLI: its config names objects the CLI cannot load, and
    # the refusal says so (exit 2), without touching the run
    r = CliRunner().invoke(app, ["adapt", "--resume", str(first.run_dir), "--json"])
    assert r.exit_code == 2 and "test:sum" in r.output


def test_a_python_run_of_named_parts_resumes_from_the_cli(tmp_path):
    from tests.servers import StubServer

    with StubServer([("ok", "Answer: 3")]) as solver, StubServer([("ok", GOOD_EDIT)]) as proposer:
        run = whale.adapt("rg:basic_arithmetic", "single_call", f"s@{solver.base_url}",
                          f"p@{proposer.base_url}", out=tmp_path / "n", **SMALL,
                          overrides=["solver.cache=false", "proposer.cache=false"])  # fmt: skip
        asked = len(proposer.requests)
        r = CliRunner().invoke(app, ["adapt", "--resume", str(run.run_dir), "--json"])
    assert r.exit_code == 0, r.output
    again = json.loads(r.output.strip().splitlines()[-1])
    assert again["rollouts_paid_this_invocation"] == 0 and len(proposer.requests) == asked
    assert again["final_eval"]["accuracy"] == run.held_out["final"].accuracy


def test_a_cli_run_resumes_from_python(tmp_path):
    from tests.servers import StubServer

    out = tmp_path / "c"
    with StubServer([("ok", "Answer: 3")]) as solver, StubServer([("ok", GOOD_EDIT)]) as proposer:
        r = CliRunner().invoke(app, [
            "adapt", "--task", "rg:basic_arithmetic", "--solver", f"s@{solver.base_url}",
            "--proposer", f"p@{proposer.base_url}", "--rounds", "1", "--g", "2", "--dev", "6",
            "--eval", "6", "--feedback", "3", "--set", "solver.cache=false", "--set",
            "proposer.cache=false", "--out", str(out), "--json"])  # fmt: skip
        assert r.exit_code == 0, r.output
        again = whale.adapt(resume=out)
    first = json.loads(r.output.strip().splitlines()[-1])
    assert again.records["rollouts_paid_this_invocation"] == 0
    assert again.records["final_eval"] == first["final_eval"]


def test_an_eval_run_is_made_new_never_over_another(tmp_path):
    out = tmp_path / "e"
    whale.evaluate(SumTask(), SEED, ScriptedModel(["1"]), n=2, out=out)
    with pytest.raises(RunDirNotEmpty) as e:
        whale.evaluate(SumTask(), SEED, ScriptedModel(["1"]), n=2, out=out)
    assert e.value.field == "out"


def test_a_killed_python_run_resumes_from_python(tmp_path):
    """SIGKILL a `whale.adapt` running in a child process mid-run, then resume it here: it
    finishes, pays for no rollout twice, and reads as an uninterrupted run does."""
    out = tmp_path / "k"
    child = ROOT / "tests" / "api_child.py"
    proc = subprocess.Popen([sys.executable, str(child), str(out)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    ledger = out / "outcomes.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if ledger.exists() and len(ledger.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the child finished before it was killed"
    paid_before = len(ledger.read_text().splitlines())
    resumed = whale.adapt(SumTask(), SEED, prose_solver(), ScriptedModel([GOOD_EDIT]), resume=out)
    whole = small_adapt(tmp_path / "w")
    rows = [json.loads(x) for x in ledger.read_text().splitlines()]
    keys = [(r["harness"], r["question_id"]) for r in rows]
    assert len(keys) == len(set(keys))  # no rollout paid twice
    assert resumed.records["rollouts_paid_this_invocation"] == len(rows) - paid_before
    assert resumed.held_out == whole.held_out and resumed.harness == whole.harness


# --- typed errors, never an exit ----------------------------------------------------------


def test_a_bad_field_value_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError) as e:
        whale.adapt(SumTask(), SEED, prose_solver(), ScriptedModel(["x"]), rounds=0,
                    out=tmp_path / "r")  # fmt: skip
    assert e.value.field == "rounds" and not (tmp_path / "r").exists()


def test_a_bad_choice_from_fields_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError) as e:
        whale.adapt(SumTask(), SEED, prose_solver(), ScriptedModel(["x"]),
                    fields={"select": "greedy"}, out=tmp_path / "r")  # fmt: skip
    assert e.value.field == "select" and "greedy" in str(e.value)


def test_a_bad_override_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError) as e:
        whale.evaluate(SumTask(), SEED, ScriptedModel(["1"]), out=tmp_path / "r",
                       overrides={"runtime.sandbox": "foo"})  # fmt: skip
    assert e.value.field == "runtime.sandbox"


def test_an_unknown_task_names_task_id(tmp_path):
    with pytest.raises(UnknownTask) as e:
        whale.evaluate("nope:x", "single_call", ScriptedModel(["1"]), out=tmp_path / "r")
    assert e.value.field == "task.id"


def test_a_task_whose_questions_fail_is_task_unavailable(tmp_path):
    class Broken(SumTask):
        def questions(self):
            raise RuntimeError("dataset missing")

    with pytest.raises(TaskUnavailable) as e:
        whale.evaluate(Broken(), SEED, ScriptedModel(["1"]), out=tmp_path / "r")
    assert e.value.field == "task.config" and "dataset missing" in str(e.value)


def test_an_unknown_model_names_its_role(tmp_path):
    with pytest.raises(UnknownModel) as e:
        whale.adapt(SumTask(), SEED, prose_solver(), "no-such-model", out=tmp_path / "r", **SMALL)
    assert e.value.field == "proposer.name"
    with pytest.raises(UnknownModel) as e:
        whale.evaluate(SumTask(), SEED, "no-such-model", out=tmp_path / "r")
    assert e.value.field == "model.name"


def test_a_missing_harness_and_a_seed_without_run_name_harness(tmp_path):
    with pytest.raises(HarnessUnavailable) as e:
        whale.evaluate(SumTask(), "no/such/harness.py", ScriptedModel(["1"]), out=tmp_path / "r")
    assert e.value.field == "harness"
    with pytest.raises(HarnessUnavailable) as e:
        whale.adapt(SumTask(), "x = 1\nprint(x)\n", prose_solver(), ScriptedModel(["x"]),
                    out=tmp_path / "r", **SMALL)  # fmt: skip
    assert e.value.field == "harness"


def test_unsafe_without_saying_so_is_refused_naming_runtime_sandbox(tmp_path):
    with pytest.raises(ConfigError) as e:
        whale.evaluate(SumTask(), SEED, ScriptedModel(["1"]), out=tmp_path / "r",
                       overrides=["runtime.sandbox=unsafe"])  # fmt: skip
    assert e.value.field == "runtime.sandbox" and "unsafe_no_sandbox=True" in str(e.value)


def test_splits_too_large_for_the_task_are_refused(tmp_path):
    with pytest.raises(SplitRefused):
        whale.adapt(SumTask(n=8), SEED, prose_solver(), ScriptedModel(["x"]), dev=6, eval=6,
                    out=tmp_path / "r")  # fmt: skip


def test_an_out_that_is_a_file_or_not_empty_is_refused_before_any_run(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(OutNotADirectory) as e:
        whale.evaluate(SumTask(), SEED, ScriptedModel(["1"]), out=tmp_path / "f" / "run")
    assert e.value.field == "out"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(RunDirNotEmpty):
        whale.evaluate(SumTask(), SEED, ScriptedModel(["1"]), out=tmp_path / "full")


def test_a_run_dir_held_by_another_process_is_refused(tmp_path):
    run = small_adapt(tmp_path / "a")
    code = f"from whale.records import RunLock; import time; RunLock({str(run.run_dir)!r}); " \
           "print('held', flush=True); time.sleep(60)"  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirInUse):
            whale.adapt(SumTask(), SEED, prose_solver(), ScriptedModel([GOOD_EDIT]),
                        resume=run.run_dir)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()


def test_a_resume_that_changes_the_experiment_names_the_field(tmp_path):
    run = small_adapt(tmp_path / "a")
    with pytest.raises(ResumeMismatch) as e:
        whale.adapt(SumTask(), SEED, prose_solver(), ScriptedModel([GOOD_EDIT]), dev=5,
                    resume=run.run_dir)  # fmt: skip
    assert e.value.field == "dev"


def test_resuming_a_folder_without_a_run_is_a_record_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordError):
        whale.adapt(SumTask(), SEED, prose_solver(), ScriptedModel(["x"]),
                    resume=tmp_path / "empty")  # fmt: skip


def test_a_config_of_the_wrong_kind_is_refused(tmp_path):
    from whale.evaluation import EvalConfig

    with pytest.raises(ConfigError) as e:
        whale.adapt(SumTask(), SEED, prose_solver(), ScriptedModel(["x"]), config=EvalConfig())
    assert e.value.field == "config"


def test_train_proposer_refuses_an_unknown_stage_and_a_missing_run(tmp_path):
    with pytest.raises(ConfigError) as e:
        whale.train_proposer("rl")  # type: ignore[arg-type]
    assert e.value.field == "stage"
    with pytest.raises(whale.WhaleError) as e2:
        whale.train_proposer("grpo", tmp_path / "none")
    assert e2.value.field == "run"


def test_every_refusal_is_a_whale_error():
    for cls in (ConfigError, UnknownTask, UnknownModel, TaskUnavailable, HarnessUnavailable,
                SplitRefused, OutNotADirectory, RunDirNotEmpty, RunDirInUse, ResumeMismatch,
                RecordError):  # fmt: skip
        assert issubclass(cls, whale.WhaleError), cls


def _library_nodes(tree: ast.Module):
    """Every node of a module but those under `if __name__ == "__main__":` (a script's own
    entry point may exit)."""
    for top in tree.body:
        if isinstance(top, ast.If) and "__main__" in ast.unparse(top.test):
            continue
        yield from ast.walk(top)


def test_nothing_below_the_cli_exits_the_process():
    """No module of the library imports typer, calls sys.exit or raises SystemExit: only
    `whale.cli` exits."""
    offenders = []
    for path in (ROOT / "whale").rglob("*.py"):
        if "cli" in path.relative_to(ROOT / "whale").parts[:1]:
            continue
        for node in _library_nodes(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(n == "typer" or n.startswith("typer.") for n in names):
                offenders.append(f"{path}: imports typer")
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.exit":
                offenders.append(f"{path}:{node.lineno}: sys.exit")
            if isinstance(node, ast.Raise) and node.exc is not None \
                    and "SystemExit" in ast.unparse(node.exc):  # fmt: skip
                offenders.append(f"{path}:{node.lineno}: raise SystemExit")
    assert offenders == []


# --- what the hostile review found ------------------------------------------------------------


def test_search_from_python_accepts_the_fix_and_reads_the_held_out_split(tmp_path):
    from tests.metaharness.test_loop import GOOD

    run = whale.search(SumTask(n=12), SEED, prose_solver(), ScriptedModel([GOOD]), iterations=2,
                       m=1, dev=6, eval=6, workers=3, out=tmp_path / "s")  # fmt: skip
    assert run.held_out["seed"].correct == 0 and run.held_out["final"].correct == 6
    assert "re.findall" in (run.harness or "")


def test_a_task_object_is_recorded_so_no_named_task_or_other_questions_reuse_its_ledger(tmp_path):
    """A task object's config field is `object:NAME@DIGEST`: the CLI cannot resume it as the
    named task of the same name, and a resume with other questions is a changed task.id."""
    from whale.tasks import load_task

    shaped = load_task("rg:basic_arithmetic", size=12, config={"min_terms": 5, "max_terms": 6})
    run = whale.evaluate(shaped, "single_call", ScriptedModel(["1"]), n=2, out=tmp_path / "e")
    assert run.records["task"].startswith("object:rg:basic_arithmetic@")
    first = small_adapt(tmp_path / "a")
    with pytest.raises(ResumeMismatch) as e:
        whale.adapt(SumTask(n=41), SEED, prose_solver(), ScriptedModel([GOOD_EDIT]),
                    resume=first.run_dir)  # fmt: skip
    assert e.value.field == "task.id"


def test_objects_that_are_not_tasks_or_models_are_refused_naming_the_field(tmp_path):
    class Duck:  # a task's four members, without TaskBase's defaults
        name, description = "duck", "a duck"

        def questions(self):
            return []

        def grade(self, q, a):
            raise AssertionError

    with pytest.raises(ConfigError) as e:
        whale.evaluate(Duck(), SEED, ScriptedModel(["1"]), out=tmp_path / "d")
    assert e.value.field == "task.id" and "TaskBase" in str(e.value)
    with pytest.raises(ConfigError) as e:
        whale.evaluate(SumTask(), SEED, {"name": "x"}, out=tmp_path / "d")  # type: ignore[arg-type]
    assert e.value.field == "model.name" and not (tmp_path / "d").exists()


def test_a_model_path_is_a_name_not_an_object(tmp_path):
    with pytest.raises(whale.WhaleError) as e:  # a missing .gguf: refused, naming the field
        whale.evaluate(SumTask(), SEED, tmp_path / "x.gguf", n=2, out=tmp_path / "p")
    assert e.value.field == "model.name" and not (tmp_path / "p").exists()


def test_a_resume_refuses_a_changed_task_before_loading_it(tmp_path):
    run = small_adapt(tmp_path / "a")
    with pytest.raises(ResumeMismatch) as e:  # not UnknownTask: nothing new is loaded
        whale.adapt(resume=run.run_dir, fields={"task.id": "nope:x"})
    assert e.value.field == "task.id"


def test_a_resume_with_another_out_is_refused(tmp_path):
    run = small_adapt(tmp_path / "a")
    with pytest.raises(ResumeMismatch) as e:
        whale.adapt(SumTask(), SEED, prose_solver(), ScriptedModel([GOOD_EDIT]),
                    resume=run.run_dir, out=tmp_path / "elsewhere")  # fmt: skip
    assert e.value.field == "out" and not (tmp_path / "elsewhere").exists()


def test_fields_refine_a_model_config_given_whole(tmp_path):
    from whale.evaluation import EvalConfig
    from whale.models import ModelConfig
    from whale.runs.given import build_config, given_fields

    given, _ = given_fields({"model.cache": False, "model.timeout_s": 5.0},
                            model=ModelConfig(name="m", base_url="http://127.0.0.1:9"))  # fmt: skip
    cfg = build_config(EvalConfig, None, (), given)
    assert (cfg.model.name, cfg.model.cache, cfg.model.timeout_s) == ("m", False, 5.0)


def test_an_override_key_cannot_carry_a_second_assignment():
    from whale.runs.given import override_list

    with pytest.raises(ConfigError) as e:
        override_list({"harness=single_call\nx": "y"})
    assert e.value.field == "overrides"
    assert override_list({"harness": "h\U0001f600.py"}) == ['harness="h\U0001f600.py"']


def test_cotrain_takes_named_models_only(tmp_path):
    with pytest.raises(ConfigError) as e:
        whale.cotrain("rg:basic_arithmetic", "single_call", prose_solver(),  # type: ignore[arg-type]
                      out=tmp_path / "c")  # fmt: skip
    assert e.value.field == "solver.name"
    with pytest.raises(ConfigError) as e:
        whale.rsft("rg:basic_arithmetic", SEED, "qwen-coder-0.5b", out=tmp_path / "c")
    assert e.value.field == "harness"


def test_ctrl_c_in_a_python_run_raises_run_interrupted_naming_the_run(tmp_path):
    def stop(outcome, trajectory):
        raise KeyboardInterrupt

    with pytest.raises(whale.RunInterrupted) as e:
        whale.evaluate(SumTask(), SEED, ScriptedModel(["1"]), n=6, workers=1,
                       out=tmp_path / "i", on_done=stop)  # fmt: skip
    assert e.value.run_dir == tmp_path / "i" and e.value.total == 6
    assert len((tmp_path / "i" / "outcomes.jsonl").read_text().splitlines()) >= 1


def test_an_unavailable_tracker_is_refused_naming_tracking(tmp_path):
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    with pytest.raises(whale.WhaleError) as e:
        small_adapt(tmp_path / "t", fields={"tracking": "wandb"})
    assert e.value.field == "tracking" and not (tmp_path / "t").exists()


def test_train_proposer_refuses_a_config_object_over_a_runs_saved_config(tmp_path):
    from whale.runs import save_run_config
    from whale.train.proposer.run import ProposerTrainConfig

    run = tmp_path / "p"
    run.mkdir()
    save_run_config(run, ProposerTrainConfig())
    with pytest.raises(ConfigError) as e:  # never silently ignored
        whale.train_proposer("grpo", run, config=ProposerTrainConfig())
    assert e.value.field == "config"


def test_a_resume_after_the_tasks_data_file_was_edited_is_refused(tmp_path):
    """The config names the file, not its questions: the splits record (splits.json) does."""
    data = tmp_path / "qa.jsonl"
    rows = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)}
            for i in range(14)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = whale.adapt(f"jsonl:{data}", SEED, prose_solver(), ScriptedModel([GOOD_EDIT]),
                      out=tmp_path / "a", **SMALL)  # fmt: skip
    for r in rows:  # every question reworded: whichever split each was drawn into
        r["question"] = r["question"].replace("+", "*")
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ResumeMismatch, match="split is not the one the run started with"):
        whale.adapt(f"jsonl:{data}", SEED, prose_solver(), ScriptedModel([GOOD_EDIT]),
                    resume=run.run_dir)  # fmt: skip
