import re

import pytest

from tests.fakes import ScriptedModel
from whale.tasks import Grade, Question, TaskBase


class SumTask(TaskBase):
    """A tiny task: 'What is a + b?'; exact integer answers."""

    name = "test:sum"
    description = "Add two integers. Answer with the number only."

    def __init__(self, n=40):
        self._qs = [
            Question(id=f"s{i}", prompt=f"What is {i} + {2 * i + 1}?", reference=3 * i + 1)
            for i in range(n)
        ]

    def questions(self):
        return list(self._qs)

    def expected(self, q):
        return str(q.reference)

    def grade(self, q, answer):
        ok = answer.strip() == str(q.reference)
        return Grade(1.0 if ok else 0.0, ok)


def prose_solver():
    """Answers right, but wrapped in prose (like the embedded 0.5B on basic_arithmetic)."""

    def reply(messages, sampling):
        a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
        return f"Sure! The answer is {a + b}."

    return ScriptedModel(reply)


SEED = "def run(question, env):\n    reply = env.llm(question)\n    return reply.text.strip()\n"
GOOD_EDIT = (
    "The reply has prose around the number; return the last number.\n"
    "<<<<<<< SEARCH\n    return reply.text.strip()\n=======\n"
    "    import re\n    return re.findall(r'-?\\d+', reply.text)[-1]\n>>>>>>> REPLACE\n"
)
BAD_EDIT = (
    "Return a constant.\n"
    "<<<<<<< SEARCH\ndef run(question, env):\n=======\ndef run(question, env):\n    return '0'\n"
    ">>>>>>> REPLACE\n"
)


@pytest.fixture
def task():
    return SumTask()
