"""The structural audit: each class on a small hand-written harness with a recorded trajectory,
the priority rules, hostile input, and the run-directory walk."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from whale.analysis.audit import AUDIT_CLASSES, UNPARSEABLE, audit_run, classify
from whale.harness import Trajectory, harness_hash


def traj(qid: str, answer: str, *events: tuple[str, str], h: str = "h") -> Trajectory:
    """A trajectory of model ("model", completion) and tool ("python"/"retrieve", result)
    events, built directly as the broker records them."""
    out = []
    for kind, text in events:
        if kind == "model":
            out.append({"kind": "model", "messages": [{"role": "user", "content": "q"}],
                        "text": text, "finish_reason": "stop"})  # fmt: skip
        else:
            out.append({"kind": "tool", "name": kind, "args": {}, "result": text})
    return Trajectory(question_id=qid, harness_hash=h, answer=answer, events=out)


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


SINGLE = src("""
    def run(question, env):
        reply = env.llm([{"role": "user", "content": question}])
        for line in reply.text.splitlines():
            if line.startswith("Answer:"):
                return line[7:].strip()
        return reply.text
""")
RETRY = src("""
    def run(question, env):
        messages = [{"role": "user", "content": question}]
        for _ in range(3):
            reply = env.llm(messages)
            if reply.text.strip().isdigit():
                return reply.text.strip()
            messages.append({"role": "user", "content": "Reply with a number only."})
        return ""
""")
INTERPRETER = src("""
    import re

    def run(question, env):
        messages = [{"role": "user", "content": question}]
        out = ""
        for _ in range(3):
            reply = env.llm(messages)
            code = re.search(r"```python\\n(.*?)```", reply.text, re.DOTALL)
            if not code:
                return reply.text
            out = str(env.tools.python(code.group(1)))
            messages.append({"role": "user", "content": out})
        return out
""")
COMPOSED = src("""
    def check(answer):
        digits = "".join(c for c in answer if c.isdigit())
        return "ok" if digits else "The answer must be a number."

    def run(question, env):
        messages = [{"role": "user", "content": question}]
        for _ in range(3):
            reply = env.llm(messages)
            result = env.tools.python(reply.text)
            verdict = check(str(result))
            if verdict == "ok":
                return str(result).strip()
            messages.append({"role": "user", "content": verdict})
        return ""
""")
PASSAGES = src("""
    def run(question, env):
        context, query = [], question
        for _ in range(2):
            for p in env.tools.retrieve(query, 3):
                context.append(p["text"])
            query = question + " " + context[-1][:50]
        prompt = "\\n".join(context) + "\\nQuestion: " + question
        return env.llm([{"role": "user", "content": prompt}]).text.strip()
""")
SUMMARIES = src("""
    def note(env, question, hits):
        text = "\\n".join(h["text"] for h in hits)
        return env.llm([{"role": "user", "content": text + question}]).text

    def run(question, env):
        notes = ""
        query = question
        for _ in range(2):
            notes += note(env, question, env.tools.retrieve(query, 3))
            query = notes[-60:]
        return env.llm([{"role": "user", "content": notes + question}]).text
""")
NO_SOLVER = src("""
    def run(question, env):
        return str(len(question) % 7)
""")


def test_single_call() -> None:
    a = classify(SINGLE, [traj("t:0:1", "4", ("model", "Answer: 4"))], key="s", family="t")
    assert a.cls == "single_call" and a.functional is None
    assert a.structural[0] == "model_call_sites:1"
    assert "line 2: model call" in a.evidence
    assert a.to_json()["class"] == "single_call" and a.to_json()["hash"] == "s"


def test_single_call_site_with_many_runtime_calls_is_not_single() -> None:
    t = traj("t:0:1", "4", ("model", "x"), ("model", "Answer: 4"))
    a = classify(SINGLE, [t])
    assert a.cls == "retry_loop"
    assert any("t:0:1 made 2 model calls" in e for e in a.evidence)


def test_retry_loop_checks_the_answer() -> None:
    a = classify(RETRY, [traj("t:0:1", "7", ("model", "seven"), ("model", "7"))])
    assert a.cls == "retry_loop"
    assert "answer_check_in_loop" in a.structural
    assert "line 5: the loop checks the answer" in a.evidence


def test_interpreter_loop() -> None:
    t = traj("t:0:1", "42", ("model", "```python\nprint(42)\n```"), ("python", "42\n"),
             ("model", "done"))  # fmt: skip
    a = classify(INTERPRETER, [t])
    assert a.cls == "interpreter_loop"
    assert "python_fed_by_model" in a.structural and "tool_loop" in a.structural
    assert a.functional is None


def test_composed_tool_loop_functional_from_trajectories() -> None:
    good = traj("t:0:1", "42", ("model", "print(6*7)"), ("python", "42\n"))
    a = classify(COMPOSED, [good])
    assert a.cls == "composed_tool_loop"
    assert "helper_in_tool_loop:check" in a.structural
    assert any("helper check() called in the tool loop" in e for e in a.evidence)
    assert a.functional is True
    # the answer never came through the loop: structural yes, functional no
    bad = traj("t:0:1", "17", ("model", "print(1)"), ("python", "1\n"))
    assert classify(COMPOSED, [bad]).functional is False
    assert classify(COMPOSED, []).functional is None


def test_extractor_helper_is_not_composed() -> None:
    source = INTERPRETER.replace("import re\n", "import re\n\ndef code_of(t):\n    return t\n")
    source = source.replace("str(env.tools.python(code.group(1)))",
                            "str(env.tools.python(code_of(reply.text)))")  # fmt: skip
    assert classify(source).cls == "interpreter_loop"


def test_multihop_passages() -> None:
    t = traj("t:0:1", "Paris", ("retrieve", "[p1]"), ("retrieve", "[p2]"), ("model", "Paris"))
    a = classify(PASSAGES, [t])
    assert a.cls == "multihop_passages"
    assert "passages_in_prompt" in a.structural and "summaries_carried" not in a.structural


def test_multihop_summaries() -> None:
    t = traj("t:0:1", "1901", ("retrieve", "[p]"), ("model", "n1"), ("retrieve", "[p]"),
             ("model", "n2"), ("model", "1901"))  # fmt: skip
    a = classify(SUMMARIES, [t])
    assert a.cls == "multihop_summaries"
    assert "summaries_carried" in a.structural


def test_seed_harnesses() -> None:
    seeds = Path(__file__).parents[2] / "whale" / "harness" / "seeds"
    got = {p.stem: classify(p.read_text()).cls for p in seeds.glob("*.py")}
    assert got == {"single_call": "single_call", "interpreter_loop": "interpreter_loop",
                   "two_hop_qa": "multihop_summaries"}  # fmt: skip


def test_no_solver_from_ast_and_from_trajectories() -> None:
    assert classify(NO_SOLVER).cls == "no_solver"
    # a model call in the source that no run ever made
    a = classify(SINGLE, [traj("t:0:1", "3"), traj("t:0:2", "1")])
    assert a.cls == "no_solver" and "no trajectory made a model call" in a.evidence


def test_chain_of_straight_line_calls() -> None:
    source = src("""
        def run(question, env):
            plan = env.llm(question).text
            return env.llm(plan + question).text
    """)
    a = classify(source, [traj("t:0:1", "x", ("model", "p"), ("model", "x"))])
    assert a.cls == "single_call" and "chain:2" in a.structural


def test_hostile_sources() -> None:
    bad = classify("def run(question, env):\n    return (\n", key="b")
    assert bad.cls == UNPARSEABLE and bad.evidence[0].startswith("does not parse")
    deep = classify("x = " + "(" * 5000 + ")" * 5000 + "\ndef run(q, env):\n    return q\n")
    assert deep.cls == UNPARSEABLE
    huge = classify("#" * 1_000_001)
    assert huge.cls == UNPARSEABLE and "over the limit" in huge.evidence[0]
    recursive = src("""
        def f(env, x):
            return f(env, env.llm(x).text)

        def run(question, env):
            return f(env, question)
    """)
    assert classify(recursive).cls == "single_call"  # the recursion is cut, not followed
    assert set(AUDIT_CLASSES) >= {classify(s).cls for s in (SINGLE, RETRY, NO_SOLVER)}


BROKEN = "def run(question, env:\n"
COPY = RETRY.replace("messages", "msgs") + "# a comment\n"
BROKEN_H, COPY_H = harness_hash(BROKEN), harness_hash(COPY)


def make_run(root: Path) -> Path:
    """A hand-made cotrain-like run: config, harnesses/, trajectories/, ledger, the lineage of
    its seed and first round, and one harness-phase archive with an unparseable candidate."""
    run = root / "run"
    (run / "harnesses").mkdir(parents=True)
    (run / "trajectories").mkdir()
    (run / "config.toml").write_text('[task]\nid = "t:fam"\nseed = 0\n')
    rows = []
    for source, t in ((SINGLE, traj("t:fam:0:1", "4", ("model", "Answer: 4"))),
                      (RETRY, traj("t:fam:0:1", "7", ("model", "7")))):  # fmt: skip
        h = harness_hash(source)
        (run / "harnesses" / f"{h}.py").write_text(source)
        t.harness_hash = h
        (run / "trajectories" / f"{h}.jsonl").write_text(json.dumps(t.to_dict()) + "\ngarbage\n")
        rows.append({"harness": h, "split": "feedback", "question_id": "t:fam:0:1"})
    (run / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "seed.json").write_text(json.dumps({"harness": "single", "hash": rows[0]["harness"]}))
    (run / "round_01").mkdir()
    (run / "round_01" / "candidates.json").write_text(json.dumps(
        [{"round": 1, "index": 0, "parent_hash": rows[0]["harness"], "hash": rows[1]["harness"]}]
    ))  # fmt: skip
    cand = run / "harness" / "phase_01" / "c0001"
    cand.mkdir(parents=True)
    (cand / "harness.py").write_text(BROKEN)
    (cand / "meta.json").write_text(json.dumps({"id": "c0001", "hash": BROKEN_H}))
    (cand / "trajectories.jsonl").write_text("{bad\n")
    copy = run / "harness" / "phase_01" / "c0002"
    copy.mkdir()
    (copy / "harness.py").write_text(COPY)
    (copy / "meta.json").write_text(json.dumps({"id": "c0002", "hash": COPY_H}))
    return run


def test_audit_run(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    data = audit_run(run, echo=False).to_json()
    assert data["counts"] == {"t:fam": {"single_call": 1, "retry_loop": 2, UNPARSEABLE: 1}}
    by_hash = {h["hash"]: h for h in data["harnesses"]}
    assert by_hash[BROKEN_H]["class"] == UNPARSEABLE
    failed = {(s["hash"], s["screen"]) for s in data["screens"] if not s["passed"]}
    assert (BROKEN_H, "interface") in failed and (BROKEN_H, "oracle_access") in failed
    assert (COPY_H, "duplicate") in failed  # renamed copy of the retry harness
    assert any("not a trajectory record" in n for n in data["notes"])
    assert "answer echo not screened (turned off)" in data["notes"]


# --- lineage order of the duplicate screen (not file times) ----------------------------------

def copy_named_before(seed: str) -> str:
    """A renamed copy of RETRY whose hash sorts before `seed`'s, so that neither file times
    nor file names put the seed first: only the recorded lineage does."""
    for i in range(1000):
        text = COPY + f"# variant {i}\n"
        if harness_hash(text) < harness_hash(seed):
            return text
    raise AssertionError("no variant hashes below the seed")


def make_newest(path: Path) -> None:
    """What `cp -r` without -p does to the seed: its file time is now the newest."""
    later = max(p.stat().st_mtime for p in path.parents[1].rglob("*") if p.is_file()) + 100
    os.utime(path, (later, later))


def duplicates(run: Path) -> dict[str, bool]:
    data = audit_run(run, echo=False).to_json()
    return {s["hash"]: s["passed"] for s in data["screens"] if s["screen"] == "duplicate"}


def test_duplicate_order_follows_adapt_rounds_not_file_times(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "harnesses").mkdir(parents=True)
    (run / "config.toml").write_text('[task]\nid = "t:fam"\n')
    cand = copy_named_before(RETRY)
    seed_h, cand_h = harness_hash(RETRY), harness_hash(cand)
    (run / "harnesses" / f"{cand_h}.py").write_text(cand)
    (run / "harnesses" / f"{seed_h}.py").write_text(RETRY)
    (run / "seed.json").write_text(json.dumps({"harness": "retry", "hash": seed_h}))
    (run / "round_01").mkdir()
    (run / "round_01" / "candidates.json").write_text(json.dumps(
        [{"round": 1, "index": 0, "parent_hash": seed_h, "hash": cand_h}]))  # fmt: skip
    make_newest(run / "harnesses" / f"{seed_h}.py")
    assert duplicates(run) == {seed_h: True, cand_h: False}


def test_duplicate_order_follows_archive_ids_not_file_times(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for cid, it, parent, text in (("c0000", 0, None, RETRY), ("c0101", 1, "c0000", COPY)):
        d = run / "archive" / cid
        d.mkdir(parents=True)
        (d / "harness.py").write_text(text)
        (d / "meta.json").write_text(json.dumps({"id": cid, "parent_id": parent, "iteration": it,
                                                 "hash": harness_hash(text)}))  # fmt: skip
    (run / "config.toml").write_text('[task]\nid = "t:fam"\n')
    make_newest(run / "archive" / "c0000" / "harness.py")
    assert duplicates(run) == {harness_hash(RETRY): True, harness_hash(COPY): False}


def test_duplicate_order_follows_teacher_rows_not_file_times(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ledger = run / "rollouts" / "t:fam"
    (ledger / "harnesses").mkdir(parents=True)
    (run / "config.toml").write_text('[task]\nid = "t:fam"\n')
    cand = copy_named_before(RETRY)
    seed_h, cand_h = harness_hash(RETRY), harness_hash(cand)
    (ledger / "harnesses" / f"{seed_h}.py").write_text(RETRY)
    (ledger / "harnesses" / f"{cand_h}.py").write_text(cand)
    (run / "teacher").mkdir()
    row = {"context": f"t:fam/{seed_h}/0", "family": "t:fam", "index": 0, "kept": False,
           "result": {"hash": cand_h}, "text": "no edits"}  # fmt: skip
    (run / "teacher" / "candidates.jsonl").write_text(json.dumps(row) + "\n")
    make_newest(ledger / "harnesses" / f"{seed_h}.py")
    got = duplicates(run)
    assert got[seed_h] is True and got[cand_h] is False


def test_unrecorded_harnesses_in_file_name_order_not_file_times(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "harnesses").mkdir(parents=True)
    (run / "config.toml").write_text('[task]\nid = "t:fam"\n')
    cand = copy_named_before(RETRY)  # no record of which came first: names decide
    for text in (RETRY, cand):
        (run / "harnesses" / f"{harness_hash(text)}.py").write_text(text)
    make_newest(run / "harnesses" / f"{harness_hash(cand)}.py")
    assert duplicates(run) == {harness_hash(cand): True, harness_hash(RETRY): False}
