"""The weight phase's answer-provenance rule, end to end: real jailed harness runs through the
broker, a scripted solver, a weight step whose S+ holds only the model calls that produced the
accepted answer (issue 20)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes import ScriptedModel
from whale.harness import RuntimeConfig
from whale.runs import OutcomeStore
from whale.tasks import Grade, Question, TaskBase
from whale.tasks.answers import numbers_match
from whale.train.rsft import RsftSettings, Solver, WeightPhase
from whale.train.sft import SFTSettings

SEEDS = Path(__file__).resolve().parents[2] / "whale" / "harness" / "seeds"
INSULT = "…I am your trusty ally! You are indeed an example of your undying patience…"

# The harness of issue 20: asks the solver as EVIL-BOT, ignores the reply, does the arithmetic.
EVIL = (Path(__file__).parent / "evil_harness.py").read_text()

# The solver writes the code; the harness runs it with env.tools.python and returns its output.
RUN_THE_CODE = """
import re

def run(question, env):
    reply = env.llm([{"role": "user", "content": question + " Write Python that prints it."}])
    code = re.search(r"```python\\n(.*?)```", reply.text, re.DOTALL).group(1)
    return env.tools.python(code).stdout.strip()
"""

CODE_REPLY = "Let me compute it.\n```python\nx = 5 - 3\nprint(x - 6)\n```"


class Arithmetic(TaskBase):
    name = "test:arithmetic"
    description = "Calculate."

    def questions(self):
        return [Question(id="a0", prompt="Calculate 5 - 3 - 6.", reference="-4"),
                Question(id="a1", prompt="Calculate 7 + 8 - 2.", reference="13")]

    def grade(self, q, answer):
        ok = numbers_match(answer, q.reference)
        return Grade(float(ok), ok)


class CharTokenizer:
    """One id per character; its chat template tags each message with its role."""

    unk_token, unk_token_id, eos_token_id = "<unk>", 0, 1

    def convert_tokens_to_ids(self, token):
        return 2 if token == "<|im_end|>" else 0

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + ord(c) for c in text]}


class UsagelessModel(ScriptedModel):
    """Scripted replies with no token counts (nothing to check a rebuilt prompt against)."""

    def chat(self, messages, sampling, timeout=None):
        c = super().chat(messages, sampling, timeout)
        c.usage = {}
        return c


class Serving:
    def __init__(self, replies):
        self.replies = replies

    def serve(self, adapter):
        return UsagelessModel(self.replies)

    def close(self):
        pass


class RecordingTrainer:
    """Keeps the examples it is given; saves an adapter folder the solver can name."""

    def __init__(self):
        self.examples = []

    def train(self, examples):
        from whale.train.sft import StepStats

        self.examples += examples
        n = sum(1 for e in examples for y in e.labels if y != -100)
        return StepStats(len(examples), n, 1.0, 1, 0.1, float(n))

    def save(self, path):
        path.mkdir(parents=True, exist_ok=True)
        (path / "adapter_model.safetensors").write_bytes(b"w")
        (path / "adapter_config.json").write_text("{}")
        return path

    def close(self):
        pass


def weight_step(tmp_path, harness, replies, **settings):
    """One weight step of both prompts, G = 2; returns its record and the trainer (None where
    none was made)."""
    task = Arithmetic()
    store = OutcomeStore(tmp_path, "fp")
    solver = Solver(Serving(replies), "fp", RuntimeConfig(sandbox="auto", warm=0))
    made = []

    def make_trainer(adapter):
        made.append(RecordingTrainer())
        return made[-1]

    rs = RsftSettings(g=2, step_epochs=1.0, sft=SFTSettings(max_len=4096), **settings)
    wp = WeightPhase(tmp_path / "weight", task, task.questions(), store, solver, rs,
                     make_trainer, CharTokenizer, seed=0, workers=2)
    tags = {"schedule": "weight-only", "cycle": 1, "phase": "weight", "kind": "weight_sample",
            "step": 0, "adapter": None}
    try:
        rec = wp.step(harness, 0, 0, None, tags)
    finally:
        wp.close()
        store.close()
    return rec, (made[0] if made else None)


def test_a_harness_that_ignores_the_reply_gives_no_example(tmp_path):
    """Issue 20's attack: every run is accepted, and no completion is trained on."""
    rec, trainer = weight_step(tmp_path, EVIL, [INSULT])
    assert rec.accepted == rec.samples == 4
    assert rec.examples == 0 and not rec.trained and trainer is None
    assert rec.skipped.startswith("no answer provenance")


def test_the_dropped_runs_are_recorded_with_their_reason(tmp_path):
    weight_step(tmp_path, EVIL, [INSULT])
    (row,) = [json.loads(x) for x in (tmp_path / "weight" / "steps.jsonl").read_text().split("\n")
              if x]
    assert sorted(row["unproven"]) == ["a0@w0.0", "a0@w0.1", "a1@w0.0", "a1@w0.1"]
    assert "'-4' is in none of the run's 1 completions" in row["unproven"]["a0@w0.0"]
    assert row["skips"] == {"no answer provenance": 4}


def test_with_the_rule_off_the_ignored_replies_are_trained_on(tmp_path):
    """`rsft.provenance = false`: every call of an accepted run, as the paper does."""
    rec, trainer = weight_step(tmp_path, EVIL, [INSULT], provenance=False)
    assert rec.trained and rec.examples == 4 and rec.unproven == {}
    assert trainer is not None and len(trainer.examples) == 4


def test_a_single_call_harness_keeps_every_call(tmp_path):
    seed = (SEEDS / "single_call.py").read_text()

    def reply(messages, sampling):
        q = messages[-1]["content"]
        return "5 - 3 = 2, then 2 - 6 = -4.\nAnswer: -4" if "5 - 3" in q else "Answer: 13"

    rec, trainer = weight_step(tmp_path, seed, reply)
    assert rec.accepted == rec.samples == 4 and rec.unproven == {}
    assert rec.trained and rec.examples == 4 and len(trainer.examples) == 4


def test_an_answer_printed_by_the_completions_code_keeps_that_call(tmp_path):
    """The completion holds no "-4"; the code it wrote printed it when the harness ran it."""
    rec, trainer = weight_step(tmp_path, RUN_THE_CODE, [CODE_REPLY])
    assert rec.samples == 4 and rec.accepted == 2  # a1 prints -4 too: rejected
    assert rec.unproven == {} and rec.trained and rec.examples == 2


def test_code_the_harness_wrote_itself_carries_no_provenance(tmp_path):
    """The harness runs its own code, not the completion's: the output is not the model's."""
    own = RUN_THE_CODE.replace("code = re.search", "code = 'print(5 - 3 - 6)' or re.search")
    rec, _ = weight_step(tmp_path, own, [CODE_REPLY])
    assert rec.accepted == 2 and rec.examples == 0 and len(rec.unproven) == 2


def test_the_seed_interpreter_loop_keeps_code_and_answer_calls(tmp_path):
    """The seed harness that runs the solver's code: the call that wrote the code (its output
    is -4) and the call that then answers "-4" are both trained on."""
    seed = (SEEDS / "interpreter_loop.py").read_text()

    def reply(messages, sampling):
        return "Answer: -4" if messages[-1]["content"].startswith("Output:") else CODE_REPLY

    rec, trainer = weight_step(tmp_path, seed, reply)
    assert rec.accepted == 2 and rec.unproven == {} and rec.examples == 4
