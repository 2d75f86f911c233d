"""A hostile reviewer's attacks on the audit and the screens, each reproduced: FIFOs and links
in a run folder, a config too deep to parse, harnesses that read files or import the task
package through doors the first screens left open, a second source under a known hash,
model calls through paths the syntax tree does not follow, substring matches of the answer,
and a config that names a dataset file outside the run."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.analysis.test_audit import COMPOSED, traj
from whale.analysis.audit import answer_occurs, audit_run, classify
from whale.analysis.run_files import read_text
from whale.analysis.screens import dev_echo_screen, edit_rows, oracle_access, screen_source
from whale.harness import Trajectory, harness_hash

BENIGN = "def run(question, env):\n    return env.llm(question).text\n"
EVIL = "import reasoning_gym\n\ndef run(question, env):\n    return 'x'\n"


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


class Hang(Exception):
    pass


@pytest.fixture
def deadline() -> Iterator[None]:
    """Fail (instead of hanging the suite) when the code under test blocks for 10 s."""

    def _raise(*_: object) -> None:
        raise Hang("blocked: the audit opened a FIFO")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def one_harness_run(tmp_path: Path, text: str = BENIGN) -> Path:
    run = tmp_path / "run"
    (run / "harnesses").mkdir(parents=True)
    (run / "harnesses" / f"{harness_hash(text)}.py").write_text(text)
    return run


# --- 3: FIFOs and links out of the run ---------------------------------------------------------


def test_fifo_harness_is_a_note_not_a_hang(tmp_path: Path, deadline: None) -> None:
    run = tmp_path / "run"
    (run / "harnesses").mkdir(parents=True)
    os.mkfifo(run / "harnesses" / "aaaa.py")
    a = audit_run(run, echo=False)
    assert [h.cls for h in a.harnesses] == ["unparseable"]
    assert any("not a regular file" in n for n in a.notes), a.notes


def test_fifo_trajectories_config_ledger_and_dataset(tmp_path: Path, deadline: None) -> None:
    run = one_harness_run(tmp_path)
    (run / "trajectories").mkdir()
    os.mkfifo(run / "trajectories" / f"{harness_hash(BENIGN)}.jsonl")
    os.mkfifo(run / "config.toml")
    os.mkfifo(run / "outcomes.jsonl")
    os.mkfifo(run / "seed.json")
    (run / "teacher").mkdir()
    os.mkfifo(run / "teacher" / "candidates.jsonl")
    a = audit_run(run, echo=False)
    assert [h.cls for h in a.harnesses] == ["single_call"]
    assert any("trajectories" in n and "not a regular file" in n for n in a.notes), a.notes
    assert any("config.toml" in n and "not a regular file" in n for n in a.notes), a.notes
    assert any(s.key.endswith("candidates.jsonl") and not s.passed
               and "not a regular file" in s.evidence[0] for s in a.screens)  # fmt: skip


def test_harness_linked_out_of_the_run_is_not_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "harnesses").mkdir(parents=True)
    outside = tmp_path / "outside.py"
    outside.write_text("SECRET = 'hunter2'\n" + BENIGN)
    os.symlink(outside, run / "harnesses" / "aaaa.py")
    a = audit_run(run, echo=False)
    assert [h.cls for h in a.harnesses] == ["unparseable"]
    assert any("out of the run directory" in n for n in a.notes), a.notes
    assert "hunter2" not in json.dumps(a.to_json())


def test_read_text_refuses_fifo_link_and_size(tmp_path: Path, deadline: None) -> None:
    (tmp_path / "ok.txt").write_text("hello")
    os.mkfifo(tmp_path / "fifo")
    os.symlink("/etc/hostname", tmp_path / "out")
    assert read_text(tmp_path / "ok.txt", 10, tmp_path) == ("hello", "")
    assert read_text(tmp_path / "ok.txt", 3, tmp_path)[0] is None
    assert read_text(tmp_path / "fifo", 10, tmp_path)[0] is None
    text, why = read_text(tmp_path / "out", 1000, tmp_path)
    assert text is None and "out of the run directory" in why


def test_edit_rows_refuses_a_link_out(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "rows.jsonl").write_text(json.dumps({"parent_hash": "p", "text": "x"}) + "\n")
    os.symlink(tmp_path / "rows.jsonl", tmp_path / "run" / "kept.jsonl")
    rows = list(edit_rows(tmp_path / "run" / "kept.jsonl", root=tmp_path / "run"))
    assert len(rows) == 1 and rows[0].error and "out of the run directory" in rows[0].error


# --- 5: a config.toml too deep for the TOML parser ---------------------------------------------


def test_deep_toml_is_a_note(tmp_path: Path) -> None:
    run = one_harness_run(tmp_path)
    (run / "config.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    a = audit_run(run, echo=False)
    assert [h.cls for h in a.harnesses] == ["single_call"]
    assert any("nested too deeply" in n for n in a.notes), a.notes


# --- 6: file reads and task-package imports the screens must see ------------------------------

ATTACKS = {
    "codecs": """
        import codecs

        def run(question, env):
            return codecs.open("/etc/passwd").read()[:10]
    """,
    "alias_open": """
        from codecs import open as rd

        def run(question, env):
            return rd("/etc/passwd").read()[:10]
    """,
    "tokenize": """
        import tokenize

        def run(question, env):
            return tokenize.open("/etc/passwd").read()[:10]
    """,
    "imp": """
        import imp

        def run(question, env):
            rg = imp.load_module("reasoning_gym", *imp.find_module("reasoning_gym"))
            return str(rg)
    """,
    "timeit": """
        import timeit

        def run(question, env):
            box = {}
            timeit.Timer("import reasoning_gym as m; box['m'] = m", globals={"box": box}).timeit(1)
            return str(box["m"])
    """,
    "getattr": """
        def run(question, env):
            g = getattr(run, "__glo" + "bals__")
            b = g["__buil" + "tins__"]
            o = b["op" + "en"] if isinstance(b, dict) else getattr(b, "op" + "en")
            return o("/etc/passwd").read()[:10]
    """,
    "getattr_alias": """
        def run(question, env):
            ga = getattr
            return ga(env, "ll" + "m")(question).text
    """,
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_oracle_access_flags_each_door(name: str) -> None:
    res = {r.screen: r for r in screen_source("k", src(ATTACKS[name]))}
    assert not res["oracle_access"].passed, (name, res)
    assert res["oracle_access"].evidence


def test_oracle_access_evidence_names_the_door() -> None:
    ev = "\n".join(oracle_access(src(ATTACKS["alias_open"])) or [])
    assert "file read: imported name open" in ev
    ev = "\n".join(oracle_access(src(ATTACKS["imp"])) or [])
    assert "code execution import: import imp" in ev and ".load_module" in ev
    ev = "\n".join(oracle_access(src(ATTACKS["timeit"])) or [])
    assert "task package import in a string: import reasoning_gym" in ev
    ev = "\n".join(oracle_access(src(ATTACKS["getattr"])) or [])
    assert "dunder string" in ev and "getattr() with a computed name" in ev


def test_oracle_access_still_passes_plain_harnesses() -> None:
    plain = src('''
        """Ask once; a docstring may say __anything__."""
        import re

        def run(question, env):
            reply = env.llm([{"role": "user", "content": question}])
            if __name__ == "x":
                return ""
            m = re.search(r"Answer: (.*)", getattr(reply, "text"))
            return m.group(1) if m else reply.text
    ''')
    assert oracle_access(plain) == []


# --- 7: the identity of a harness is the hash of its text ------------------------------------


def test_second_source_under_a_known_name_is_screened(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for sched, text in (("a-sched", BENIGN), ("b-sched", EVIL)):
        (run / sched / "harnesses").mkdir(parents=True)
        (run / sched / "harnesses" / "aaaaaaaaaaaaaaaa.py").write_text(text)
    data = audit_run(run, echo=False).to_json()
    assert {h["hash"] for h in data["harnesses"]} == {harness_hash(BENIGN), harness_hash(EVIL)}
    failed = {s["hash"] for s in data["screens"] if s["screen"] == "oracle_access"
              and not s["passed"]}  # fmt: skip
    assert failed == {harness_hash(EVIL)}
    assert sum("recorded as 'aaaaaaaaaaaaaaaa'" in n for n in data["notes"]) == 2


def test_archive_meta_hash_spoof(tmp_path: Path) -> None:
    d = tmp_path / "run" / "archive"
    for cid, text, pid in (("c0000", BENIGN, None), ("c0101", EVIL, "c0000")):
        (d / cid).mkdir(parents=True)
        (d / cid / "harness.py").write_text(text)
        (d / cid / "meta.json").write_text(json.dumps({"id": cid, "parent_id": pid,
                                                       "hash": "same"}))  # fmt: skip
    data = audit_run(tmp_path / "run", echo=False).to_json()
    assert len(data["harnesses"]) == 2
    assert any(not s["passed"] for s in data["screens"] if s["screen"] == "oracle_access")


# --- 8: model calls through paths the syntax tree does not follow ----------------------------

HIDDEN = {
    "alias": """
        def run(question, env):
            ask = env.llm
            return ask([{"role": "user", "content": question}]).text
    """,
    "lambda": """
        ask = lambda env, q: env.llm([{"role": "user", "content": q}])

        def run(question, env):
            return ask(env, question).text
    """,
    "method": """
        class Solver:
            def go(self, env, q):
                return env.llm([{"role": "user", "content": q}]).text

        def run(question, env):
            return Solver().go(env, question)
    """,
}


def model_traj(n: int) -> Trajectory:
    return traj("rg:gcd:0:1", "4", *[("model", "4")] * n)


@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_hidden_model_calls_are_read_off_the_trajectories(name: str) -> None:
    source = src(HIDDEN[name])
    assert classify(source).cls == "no_solver"  # the AST alone cannot see the call
    one = classify(source, [model_traj(1)])
    assert one.cls == "single_call", one.evidence
    assert any("model called through a path the AST does not see" in e for e in one.evidence)
    assert classify(source, [model_traj(1), model_traj(3)]).cls == "retry_loop"


def test_the_last_def_run_is_the_one_audited() -> None:
    decoy_first = src("""
        def run(question, env):
            return "decoy"

        def run(question, env):
            return env.llm([{"role": "user", "content": question}]).text
    """)
    assert classify(decoy_first).cls == "single_call"
    decoy_last = src("""
        def run(question, env):
            return env.llm([{"role": "user", "content": question}]).text

        def run(question, env):
            return "decoy"
    """)
    assert classify(decoy_last).cls == "no_solver"


# --- 12: the composed loop's answer must occur as a whole ------------------------------------


def test_digit_answer_in_unrelated_tool_output_is_not_functional() -> None:
    t = traj("rg:gcd:0:1", "4", ("model", "The answer is 4"), ("python", "error on line 14"),
             ("model", "done"))  # fmt: skip
    a = classify(COMPOSED, [t])
    assert a.cls == "composed_tool_loop" and a.functional is False
    t = traj("rg:gcd:0:1", "4", ("model", "print(2+2)"), ("python", "4.0\n"))
    assert classify(COMPOSED, [t]).functional is True


def test_answer_occurs() -> None:
    assert answer_occurs("4", "x = 4.0") and answer_occurs("4", "(4)")
    assert not answer_occurs("4", "error on line 14") and not answer_occurs("4", "4.5")
    assert answer_occurs("1,234", "total 1234.") and not answer_occurs("12", "1,234")
    assert answer_occurs("Paris", "it is paris.") and not answer_occurs("Paris", "Parisian")
    assert answer_occurs("New  York", "in new york city") and not answer_occurs("", "x")


# --- 13: a run's config cannot make the echo screen load a file outside it -------------------


def test_echo_screen_loads_no_dataset_outside_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    record = {"_id": "x", "question": "Q?", "answer": "A", "type": "bridge", "level": "easy",
              "supporting_facts": [["T", 0]], "context": [["T", ["A is here."]]]}  # fmt: skip
    outside = tmp_path / "secret.json"
    inside = run / "data.json"
    for p in (outside, inside):
        p.write_text(json.dumps([record]))
    notes = []
    for path in (outside, tmp_path / "missing.json", Path("/etc/passwd")):
        fam = f"hotpotqa:{path}"
        screen, why = dev_echo_screen(fam, {f"{fam}:0:0"}, {"id": fam}, run)
        assert screen is None
        notes.append(why.replace(str(path), "P"))
    assert len(set(notes)) == 1 and "not loaded" in notes[0]  # exists or not: the same words
    fam = f"hotpotqa:{inside}"
    screen, why = dev_echo_screen(fam, {f"{fam}:0:0"}, {"id": fam}, run)
    assert "not loaded" not in why  # inside the run it is loaded (no dev id matches its ids)
    bad = {"id": fam, "config": {"abstracts": str(outside)}}
    assert "abstracts" in dev_echo_screen(fam, {f"{fam}:0:0"}, bad, run)[1]
    assert "index" in dev_echo_screen("rg:gcd", {"rg:gcd:0:10000"}, None, run)[1]


def test_audit_of_a_run_naming_an_outside_dataset(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text("[]")
    run = one_harness_run(tmp_path)
    fam = f"hotpotqa:{secret}"
    (run / "config.toml").write_text(f"[task]\nid = {json.dumps(fam)}\n")
    (run / "outcomes.jsonl").write_text(json.dumps({"split": "dev",
                                                    "question_id": f"{fam}:0:0"}) + "\n")
    notes = audit_run(run).notes
    assert any("not a file inside the run: not loaded" in n for n in notes), notes
