"""Answer echo through bytes (issue 20): a table of dev answers written as bytes literals and
looked up with `question.encode()` scored 8/8 and passed the echo screen, which read only str,
int and float constants. Bytes now count as the text they decode to, wherever they stand."""

import pytest

from whale.harness import load_harness, seed_names
from whale.revise.run import AdaptConfig, split_pools
from whale.revise.screens import AnswerEchoScreen, screen_questions
from whale.tasks import TaskConfig, load_task

# The issue's harness: the 8 scoring questions of `whale adapt --task rg:basic_arithmetic`
# (size 100, seed 0) and their answers, as bytes.
BYTES_TABLE = """\
TABLE = {b'Calculate 9 * 2 + -3 * -9.': b'45', b'Calculate 444 + -825 - 662.': b'-1043',
         b'Calculate -( ( -6915 / 5 ) - 7652 + 4844 ) - 7314.': b'-3123',
         b'Calculate ( -6 + -77 - 8 + -38 ).': b'-129',
         b'Calculate -( 463 / 1 ) - 10 - 562 - -849 - -869.': b'683',
         b'Calculate -( 313 - -854 ) - -741 * 247.': b'181860',
         b'Calculate 5 - 3 - 6.': b'-4', b'Calculate 3 / 3.': b'1'}


def run(question, env):
    hit = TABLE.get(question.encode())
    if hit is not None:
        return hit.decode()
    return env.llm(question).text.strip()
"""

SEED = load_harness("single_call")


@pytest.fixture(scope="module")
def screen():
    task = load_task("rg:basic_arithmetic", size=100, seed=0)
    fb, score, _ = split_pools(task, AdaptConfig(task=TaskConfig(id="rg:basic_arithmetic")))
    assert "Calculate 5 - 3 - 6." in [q.prompt for q in score]
    return AnswerEchoScreen(task, screen_questions(fb, score), baseline=SEED)


def test_the_issues_bytes_table_is_an_answer_echo(screen):
    why = screen.check(BYTES_TABLE)
    assert why is not None and why.startswith("answer echo")
    assert "rg:basic_arithmetic:0:1" in why  # "Calculate 5 - 3 - 6." -> b'-4'


def harness(table_line: str) -> str:
    return f"{table_line}\n\ndef run(question, env):\n    return env.llm(question).text\n"


@pytest.mark.parametrize(
    "table",
    [
        # bytearray of a bytes constant
        "T = {bytearray(b'Calculate 5 - 3 - 6.'): bytearray(b'-4')}",
        # bytes built from int lists and tuples of constants
        "T = {bytes([67, 97, 108, 99, 117, 108, 97, 116, 101, 32, 53, 32, 45, 32, 51, 32, 45,"
        " 32, 54, 46]): bytes((45, 52))}",
        # inside other containers: tuples, lists, sets, frozensets, dict values
        "T = [(b'Calculate 5 - 3 - 6.', b'-4')]",
        "T = frozenset({b'Calculate 5 - 3 - 6.', b'-4'})",
        "T = {'q': [b'Calculate 5 - 3 - 6.'], 'a': {b'-4'}}",
        # hex of the question, and its answer as bytes
        "T = {bytearray.fromhex('43616c63756c6174652035202d2033202d20362e'): b'-4'}",
    ],
)
def test_bytes_in_any_container_of_constants_count(screen, table):
    why = screen.check(harness(table))
    assert why is not None and "answer together with question text of" in why, table


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-16", "utf-32", "utf-32-le"])
def test_a_table_in_another_utf_encoding_is_an_echo(screen, encoding):
    # The hostile review: UTF-16 and UTF-32 tables passed while plain bytes were caught.
    q, a = "Calculate 5 - 3 - 6.".encode(encoding), "-4".encode(encoding)
    source = harness(f"T = {{{q!r}: {a!r}}}")
    why = screen.check(source)
    assert why is not None and why.startswith("answer echo")


def test_no_seed_holds_a_bytes_echo(screen):
    assert [screen.check(load_harness(n), "") for n in seed_names()] == [None] * len(seed_names())


def test_bytes_that_are_not_dev_text_are_not_an_echo(screen):
    # a legitimate use of bytes: a delimiter and an encoding round trip
    src = (
        "SEP = b'\\n\\n'\n\n"
        "def run(question, env):\n"
        "    text = env.llm(question).text.encode('utf-8')\n"
        "    return text.split(SEP)[-1].decode('utf-8', 'replace').strip()\n"
    )
    assert screen.check(src) is None
