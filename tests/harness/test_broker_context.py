"""A prompt that cannot fit the model's context is refused before it is sent (issue 20: three
messages of 7.5 MB each inflated the embedded llama-server from 774 MB to 1.98 GB, every call
ending in ContextOverflow). The bound: n_ctx * slots tokens times the vocabulary's longest
token, an upper bound on the text that could fit."""

import pytest

from tests.fakes import ScriptedModel
from tests.models.gguf_writer import vocab_gguf
from whale.harness import Budget, Limits, Runtime
from whale.models import CachedModel, Completion, EmbeddedLlama
from whale.models.base import prompt_char_limit

MB = 1024 * 1024
# A message of 7.5 MB, built inside the harness (the source stays small).
BIG = "'x' * (15 * 1024 * 1024 // 2)"


class RecordingLlama(EmbeddedLlama):
    """The embedded backend's own bound, on a GGUF of a given vocabulary; it records its calls
    instead of starting a server."""

    def __init__(self, gguf, n_ctx, slots=4):
        super().__init__(gguf, alias="fake", n_ctx=n_ctx, slots=slots)
        self.calls = []

    def chat(self, messages, sampling, timeout=None):
        self.calls.append(messages)
        return Completion("fine", "stop", {"completion_tokens": 1})


@pytest.fixture
def qwen_like(tmp_path):
    """A vocabulary whose longest token is Qwen2.5's: 256 bytes ("Ġ" is 2)."""
    return vocab_gguf(tmp_path / "qwen.gguf", ["a", "Ġ" * 128, "<|im_start|>"])


def refusals(t):
    return [e for e in t.events if e["kind"] == "refused"]


def test_the_bound_is_n_ctx_times_slots_times_the_longest_token(qwen_like):
    assert RecordingLlama(qwen_like, n_ctx=4096).prompt_char_limit() == 4096 * 4 * 256


def test_three_messages_of_7_5_mb_in_one_call_are_refused_before_sending(qwen_like):
    model = RecordingLlama(qwen_like, n_ctx=4096)
    src = ("def run(q, env):\n"
           f"    m = {{'role': 'user', 'content': {BIG}}}\n"
           "    env.llm([m, dict(m, role='assistant'), m])\n")  # fmt: skip
    # The pipe's message limit raised so that the 22.5 MB request reaches the broker.
    t = Runtime(model=model, limits=Limits(message_bytes=32 * MB)).run(src, "x")
    assert model.calls == [] and t.status == "error" and "ContextOverflow" in t.error
    assert refusals(t)[0]["op"] == "llm" and "23,592,960 characters" in refusals(t)[0]["reason"]


def test_three_calls_of_7_5_mb_each_are_refused_and_the_run_goes_on(qwen_like):
    model = RecordingLlama(qwen_like, n_ctx=4096)
    src = ("def run(q, env):\n"
           "    for _ in range(3):\n"
           "        try:\n"
           f"            env.llm({BIG})\n"
           "        except Exception:\n"
           "            pass\n"
           "    return env.llm('small') + ' ' + str(env.budget.model_calls)\n")  # fmt: skip
    t = Runtime(model=model, budget=Budget(model_calls=2)).run(src, "x")
    assert t.status == "ok" and t.answer == "fine 1" and len(model.calls) == 1
    assert [("ContextOverflow" in e["reason"]) for e in refusals(t)] == [True] * 3


def test_a_prompt_at_the_bound_is_sent_and_one_past_it_is_not(qwen_like):
    model = RecordingLlama(qwen_like, n_ctx=8, slots=1)  # 8 * 256 = 2048 characters
    src = ("def run(q, env):\n"
           "    env.llm('y' * 2048)\n"
           "    env.llm('y' * 2049)\n")  # fmt: skip
    t = Runtime(model=model).run(src, "x")
    assert len(model.calls) == 1 and "ContextOverflow" in t.error


def test_whitespace_counts_against_the_bound(qwen_like):
    # The hostile review: messages of spaces with a word at the end got 23.6M characters to
    # the model when whitespace at a message's ends was not counted.
    model = RecordingLlama(qwen_like, n_ctx=8, slots=1)
    t = Runtime(model=model).run("def run(q, env):\n    return env.llm(' ' * 2048 + 'Hi')\n", "x")
    assert model.calls == [] and "ContextOverflow" in t.error


def test_a_runtime_bound_overrides_the_model_s(qwen_like):
    model = RecordingLlama(qwen_like, n_ctx=4096)
    t = Runtime(model=model, prompt_chars=10).run("def run(q, env):\n    return env.llm('y' * 11)\n", "x")
    assert model.calls == [] and "ContextOverflow" in t.error


def test_a_model_that_does_not_know_its_context_gets_the_prompt(qwen_like):
    # An OpenAI-compatible server does not say its n_ctx: no bound, the server decides.
    model = ScriptedModel(["fine"])
    t = Runtime(model=model).run(f"def run(q, env):\n    return env.llm({BIG})\n", "x")
    assert t.status == "ok" and len(model.calls) == 1


class _Lazy:
    name = "lazy"

    def __init__(self, model):
        self.model = model

    def resolve_model(self):
        return self.model


def test_the_bound_is_read_through_the_cache_and_a_model_served_on_demand(qwen_like, tmp_path):
    cached = CachedModel(RecordingLlama(qwen_like, n_ctx=512), tmp_path / "c.sqlite")
    assert prompt_char_limit(_Lazy(cached)) == 512 * 4 * 256


def test_a_model_with_an_unreadable_vocabulary_has_no_bound(tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf")
    assert RecordingLlama(tmp_path / "bad.gguf", n_ctx=4096).prompt_char_limit() is None


def test_the_bound_travels_to_ray_actors():
    # An actor's model is a plain client of the server: the bound is resolved on the driver.
    pytest.importorskip("ray")
    from whale.harness.ray_executor import RuntimeSpec

    assert RuntimeSpec.of(Runtime(model=None, prompt_chars=77), 1).build().prompt_chars == 77
