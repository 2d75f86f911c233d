"""Screens on candidates and on datasets of edits: each accepts the clean case and rejects the
bad one, with evidence."""

from __future__ import annotations

import json
from pathlib import Path

from whale.analysis.screens import (
    dev_echo_screen,
    edit_rows,
    oracle_access,
    screen_archive,
    screen_edit_rows,
    screen_source,
)
from whale.harness import harness_hash
from whale.revise.screens import AnswerEchoScreen
from whale.tasks import Question

CLEAN = "def run(question, env):\n    return env.llm(question).text.strip()\n"


class FakeTask:
    """Two dev questions with references (a test double of the Task protocol)."""

    def expected(self, q: Question) -> str:
        return str(q.reference)


DEV = [Question("t:0:0", "What is 1234 + 4321? Show the sum.", 5555),
       Question("t:0:1", "How many legs do 17 spiders have in total?", 136),
       Question("t:0:2", "What is 2 + 9? Show the sum.", 11)]  # fmt: skip


def verdicts(results: list, key: str | None = None) -> dict[str, bool]:
    return {r.screen: r.passed for r in results if key is None or r.key == key}


def test_clean_candidate_passes_every_screen() -> None:
    echo = AnswerEchoScreen(FakeTask(), DEV)  # type: ignore[arg-type]
    got = screen_source("c", CLEAN, echo=echo)
    assert verdicts(got) == {"interface": True, "oracle_access": True, "answer_echo": True}
    assert all(r.evidence == [] for r in got)


def test_answer_echo_rejects_a_lookup_table() -> None:
    echo = AnswerEchoScreen(FakeTask(), DEV)  # type: ignore[arg-type]
    bad = ('TABLE = {"1234 + 4321": "5555"}\n\ndef run(question, env):\n'
           '    for k, v in TABLE.items():\n        if k in question:\n            return v\n'
           '    return env.llm(question).text\n')  # fmt: skip
    r = next(r for r in screen_source("c", bad, echo=echo) if r.screen == "answer_echo")
    assert not r.passed and "t:0:0" in r.evidence[0]


def test_oracle_access_finds_task_packages_files_environment() -> None:
    bad = ("import reasoning_gym\nfrom pathlib import Path\nimport os\n\n"
           "def run(question, env):\n    key = os.environ.get('K')\n"
           "    data = open('/data/answers.txt').read()\n"
           "    return Path('a').read_text() + data + str(key)\n")  # fmt: skip
    ev = oracle_access(bad)
    assert ev is not None
    assert "line 1: task package import: import reasoning_gym" in ev
    assert "line 2: file access import: from pathlib import ..." in ev
    assert "line 6: environment: environ" in ev
    assert "line 7: file read: open" in ev
    assert "line 8: file read: .read_text" in ev
    assert oracle_access(CLEAN) == []
    assert oracle_access("def run(q, env:\n") is None  # could not be checked
    dyn = "def run(q, env):\n    m = __import__('datasets')\n    return q\n"
    assert "line 2: task package import: __import__('datasets')" in (oracle_access(dyn) or [])
    assert oracle_access(CLEAN.replace("env.llm", "task.llm"), ["task"]) == []


def test_interface_violations_and_unparseable() -> None:
    got = {r.screen: r for r in screen_source("c", "def run(question):\n    return 1\n")}
    assert not got["interface"].passed and "run contract" in got["interface"].evidence[0]
    assert got["oracle_access"].passed
    broken = {r.screen: r for r in screen_source("b", "def run(q, env:\n")}
    assert not broken["interface"].passed and not broken["oracle_access"].passed
    assert broken["oracle_access"].evidence == ["not checked: does not parse"]


def test_duplicates_against_the_archive_in_order() -> None:
    renamed = CLEAN.replace("question", "q") + "# comment\n"
    other = 'def run(question, env):\n    r = env.llm("Think. " + question)\n    return r.text\n'
    got = screen_archive([("a", CLEAN, None), ("b", renamed, CLEAN), ("c", other, CLEAN),
                          ("a", CLEAN, None)])  # fmt: skip
    dup = {r.key: r for r in got if r.screen == "duplicate"}
    assert list(dup) == ["a", "b", "c"]  # the repeated key is screened once
    assert dup["a"].passed and dup["c"].passed
    assert not dup["b"].passed and dup["b"].evidence == ["duplicate of a (similarity 1.00)"]


def test_dataset_of_edits(tmp_path: Path) -> None:
    parent_hash = harness_hash(CLEAN)
    ok = "<<<<<<< SEARCH\n    return env.llm(question).text.strip()\n=======\n" \
         "    return env.llm('Be brief. ' + question).text.strip()\n>>>>>>> REPLACE\n"  # fmt: skip
    oracle = "<<<<<<< SEARCH\n    return env.llm(question).text.strip()\n=======\n" \
             "    return open('/answers').read()\n>>>>>>> REPLACE\n"  # fmt: skip
    rows = [
        {"context": f"t/{parent_hash}/single_call.0", "family": "t", "text": ok},
        {
            "prompt": [],
            "completion": [{"role": "assistant", "content": oracle}],
            "family": "t",
            "context": f"t/{parent_hash}/single_call.0",
        },
        {"context": "t/unknown/single_call.0", "family": "t", "text": ok},
        {"context": f"t/{parent_hash}/single_call.0", "family": "t", "text": "no blocks"},
    ]
    path = tmp_path / "kept.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "garbage\n")
    parsed = list(edit_rows(path))
    assert [r.parent_hash for r in parsed[:2]] == [parent_hash, parent_hash]
    assert parsed[4].error == "line 5: not a JSON object"
    got = screen_edit_rows(parsed, {parent_hash: CLEAN})
    by_row: dict[str, dict[str, bool]] = {}
    for r in got:
        by_row.setdefault(r.key.split("(")[-1].rstrip(")"), {})[r.screen] = r.passed
    assert by_row[f"{path}:1"] == {"interface": True, "oracle_access": True, "duplicate": True}
    assert by_row[f"{path}:2"]["oracle_access"] is False
    assert by_row[f"{path}:3"] == {"interface": False}  # parent not in the run
    assert by_row[f"{path}:4"] == {"interface": False}  # edits do not apply
    assert by_row[f"{path}:5"] == {"interface": False}
    assert list(edit_rows(tmp_path / "missing.jsonl"))[0].error.startswith("cannot read")


def test_dev_echo_screen_refuses_ids_it_cannot_place() -> None:
    screen, why = dev_echo_screen("t", set())
    assert screen is None and "no dev question ids" in why
    screen, why = dev_echo_screen("rg:gcd", {"hotpotqa:5ab"})
    assert screen is None and "not of the form" in why


def test_dev_echo_screen_from_a_reasoning_gym_family() -> None:
    screen, why = dev_echo_screen("rg:gcd", {"rg:gcd:0:1", "rg:gcd:0:2", "rg:gcd:0:2@w1.0"})
    assert screen is not None, why
    assert sorted(d.qid for d in screen.devs) == ["rg:gcd:0:1", "rg:gcd:0:2"]
    prompt = screen.devs[0].prompt
    echo = f"def run(question, env):\n    if question == {prompt!r}:\n        return '1'\n" \
           "    return env.llm(question).text\n"  # fmt: skip
    assert screen.check(echo) is not None and screen.check(CLEAN) is None
