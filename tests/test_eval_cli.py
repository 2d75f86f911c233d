"""`whale eval` end to end against a local OpenAI-compatible server, and its exit codes."""

import json

import pytest
from typer.testing import CliRunner

from tests.conftest import require_model
from tests.servers import StubServer
from whale.cli import app
from whale.evaluation import evaluate, read_jsonl
from whale.harness import Runtime
from whale.models import ModelConfig, build_model
from whale.tasks import load_task

runner = CliRunner()


def whale(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_eval_writes_outcomes_and_prints_json(tmp_path):
    with StubServer([("ok", "Answer: -4")]) as s:
        r = whale("eval", "--task", "rg:basic_arithmetic", "--harness", "single_call",
                  "--model", f"stub@{s.base_url}", "-n", "5", "--out", str(tmp_path / "run"),
                  "--no-cache", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["rollouts"] == 5 and summary["status"] == {"ok": 5}
    rows = read_jsonl(tmp_path / "run" / "outcomes.jsonl")
    assert len(rows) == 5
    assert set(rows[0]) >= {"question_id", "answer", "score", "correct", "status", "error"}
    assert all(r["answer"] == "-4" for r in rows)
    assert len(read_jsonl(tmp_path / "run" / "trajectories.jsonl")) == 5
    assert (tmp_path / "run" / "config.toml").read_text().count("basic_arithmetic") == 1


def test_eval_table_output(tmp_path):
    with StubServer([("ok", "Answer: 1")]) as s:
        r = whale("eval", "--model", f"stub@{s.base_url}", "-n", "2", "--out", str(tmp_path / "r"),
                  "--no-cache")  # fmt: skip
    assert r.exit_code == 0 and "accuracy" in r.output and "truncation rate" in r.output


def test_config_file_and_dotted_overrides(tmp_path):
    (tmp_path / "c.toml").write_text('n = 3\n[task]\nid = "rg:maze"\n')
    with StubServer([("ok", "Answer: 1")]) as s:
        r = whale("eval", "--config", str(tmp_path / "c.toml"), "--model", f"stub@{s.base_url}",
                  "--set", "runtime.budget.model_calls=0", "--out", str(tmp_path / "r"), "--json",
                  "--no-cache")  # fmt: skip
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["task"] == "rg:maze" and summary["status"] == {"budget_exceeded": 3}


@pytest.mark.parametrize(
    "args, named",
    [
        (["--task", "nope:x"], "nope:x"),
        (["--task", "rg:not_a_family"], "not_a_family"),
        (["--model", "gpt-17"], "gpt-17"),
        (["--harness", "/no/such/harness.py"], "/no/such/harness.py"),
        (["--set", "runtime.budget.bogus=1"], "bogus"),
    ],
)
def test_bad_arguments_exit_2_naming_the_value(tmp_path, args, named):
    r = runner.invoke(app, ["eval", "--out", str(tmp_path / "r"), *args])
    assert r.exit_code == 2 and named in r.output


def test_unsafe_sandbox_in_config_needs_the_flag(tmp_path):
    r = runner.invoke(
        app, ["eval", "--set", "runtime.sandbox=unsafe", "--out", str(tmp_path / "r")]
    )
    assert r.exit_code == 2 and "--unsafe-no-sandbox" in r.output


def test_a_harness_that_never_calls_the_model_never_starts_a_server(tmp_path):
    require_model("smollm2-135m")
    model = build_model(ModelConfig(name="smollm2-135m", cache=False))
    task = load_task("rg:basic_arithmetic", size=3)
    result = evaluate(
        Runtime(model=model), "def run(q, env):\n    return '0'\n", task, task.questions()
    )
    assert result.rho_run == 1.0 and not model.started


@pytest.mark.model
def test_eval_on_the_embedded_default_model(tmp_path):
    require_model("qwen-coder-0.5b")
    r = whale("eval", "--task", "rg:basic_arithmetic", "--model", "qwen-coder-0.5b", "-n", "3",
              "--out", str(tmp_path / "r"), "--set", f"model.cache_path='{tmp_path / 'c.sqlite'}'",
              "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["status"] == {"ok": 3} and summary["model_calls"] == 3
    trajs = read_jsonl(tmp_path / "r" / "trajectories.jsonl")
    assert all(t["events"][0]["usage"]["completion_tokens"] > 0 for t in trajs)


def test_index_build_cli(tmp_path):
    from whale.retrieval import BM25Index

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "title": f"T{i}", "text": f"text about topic{i}"}) + "\n"
            for i in range(20)
        )
    )
    r = whale("index", "build", str(corpus), "--out", str(tmp_path / "idx"), "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.output.strip().splitlines()[-1])
    assert info["passages"] == 20
    assert (
        BM25Index.load(tmp_path / "idx", expect_hash=info["corpus_hash"]).retrieve("topic7", 1)[0][
            "id"
        ]
        == "p7"
    )


def test_tasks_lists_every_task_id():
    r = whale("tasks")
    for pattern in (
        "rg:FAMILY",
        "mhqa",
        "hotpotqa:PATH",
        "musique:PATH",
        "2wiki:PATH",
        "searchqa:PATH",
        "math:PATH",
    ):
        assert pattern in r.output


def test_eval_of_the_seed_qa_harness_on_generated_multihop_qa(tmp_path):
    with StubServer([("ok", "Port Quell")]) as s:
        r = whale(
            "eval",
            "--task",
            "mhqa",
            "--harness",
            "two_hop_qa",
            "--model",
            f"stub@{s.base_url}",
            "-n",
            "3",
            "--set",
            "task.config.passages=3000",
            "--out",
            str(tmp_path / "r"),
            "--no-cache",
            "--json",
        )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["status"] == {"ok": 3} and "retrieval_accuracy" in summary
    trajs = read_jsonl(tmp_path / "r" / "trajectories.jsonl")
    assert all(
        sum(e["kind"] == "tool" and e["name"] == "retrieve" for e in t["events"]) == 2
        for t in trajs
    )


# --- exit 2 before any run dir (issue 8) ---------------------------------------------------

STUB = "stub@http://127.0.0.1:9"  # never called: each case stops before the first run


def eval_with(tmp_path, *args):
    return runner.invoke(app, ["eval", "--model", STUB, "--out", str(tmp_path / "r"), *args])


def flat(r):
    """The output with rich's line wrapping undone."""
    return " ".join(r.output.split())


@pytest.mark.parametrize(
    "override, named",
    [
        ("n=abc", "n: expected an integer, got str 'abc'"),
        ("workers=2.5", "workers: expected an integer, got float 2.5"),
        ("model=abc", "model: expected a table (ModelConfig), got str 'abc'"),
        ("runtime.sandbox=foo", "runtime.sandbox: 'foo' is not one of"),
        ("runtime.temperature=nan", "runtime.temperature: expected a finite number"),
        ("task.size=-1", "task.size: must be at least 1"),
    ],
)
def test_a_bad_set_value_exits_2_naming_the_field_and_makes_no_run_dir(tmp_path, override, named):
    r = eval_with(tmp_path, "--set", override)
    assert r.exit_code == 2 and named in flat(r)
    assert not (tmp_path / "r").exists()


def test_a_malformed_config_file_exits_2_naming_the_file(tmp_path):
    (tmp_path / "bad.toml").write_text("n = 3\n[task\n")
    r = eval_with(tmp_path, "--config", str(tmp_path / "bad.toml"))
    assert r.exit_code == 2 and "bad.toml is not valid TOML" in flat(r)


def test_an_out_that_is_a_file_exits_2(tmp_path):
    (tmp_path / "r").write_text("not a directory")
    r = eval_with(tmp_path)
    assert r.exit_code == 2 and "is not a directory" in flat(r)


def test_an_out_below_a_file_exits_2(tmp_path):
    (tmp_path / "f").write_text("")
    r = runner.invoke(app, ["eval", "--model", STUB, "--out", str(tmp_path / "f" / "run")])
    assert r.exit_code == 2 and "is not a directory" in flat(r)


def test_mhqa_with_zero_passages_exits_2_naming_the_field(tmp_path):
    r = eval_with(tmp_path, "--task", "mhqa", "--set", "task.config.passages=0")
    assert r.exit_code == 2 and "task.config.passages = 0 is below the minimum, 48" in flat(r)


def test_mhqa_refuses_an_unknown_config_field(tmp_path):
    r = eval_with(tmp_path, "--task", "mhqa", "--set", "task.config.pasages=3000")
    assert r.exit_code == 2 and "pasages" in flat(r)


def test_without_nsjail_or_bubblewrap_eval_refuses_to_start(tmp_path, monkeypatch):
    import whale.harness.sandbox as sandbox

    monkeypatch.setattr(sandbox, "nsjail_binary", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    r = eval_with(tmp_path, "-n", "2")
    out = flat(r)
    assert r.exit_code == 2 and "bubblewrap" in out and "--unsafe-no-sandbox" in out
    assert not (tmp_path / "r").exists()
