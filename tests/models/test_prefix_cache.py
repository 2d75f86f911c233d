"""Prompt prefixes reused (issue 25): which calls may use the native server's prompt cache, the G
samples of one prompt asked for in one request (`chat_n`), and the response cache keying each
of them under its own seed. Fakes and the stub server; the last tests run the real native
llama-server on SmolLM2-135M (marked `model`)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import require_model
from tests.servers import StubServer
from whale.config import ConfigError
from whale.models import CachedModel, EmbeddedLlama, ModelConfig, Sampling
from whale.models.base import Completion, ModelError, chat_n, each, reuses_prefix, shares_prompt
from whale.models.openai_compat import OpenAICompatible

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
GREEDY = Sampling(max_tokens=8, temperature=0.0, seed=5)
SAMPLED = Sampling(max_tokens=8, temperature=0.7, seed=5)


class SharingModel:
    """A backend that answers `chat_n` in one request: completion i is "s{seed + i}"."""

    def __init__(self, fail: bool = False) -> None:
        self.name = "sharing"
        self.fail = fail
        self.singles: list[int | None] = []  # the seeds chat() was asked for
        self.batches: list[tuple[int | None, int]] = []  # (first seed, n) of chat_n
        self._lock = threading.Lock()

    def chat(self, messages, sampling, timeout=None):
        with self._lock:
            self.singles.append(sampling.seed)
        return Completion(f"s{sampling.seed}", "stop", {"completion_tokens": 1})

    def shares_prompt(self, sampling):
        return sampling.temperature > 0

    def chat_n(self, messages, sampling, n, timeout=None):
        self.batches.append((sampling.seed, n))
        if self.fail:
            raise ModelError("server gone")
        return [Completion(f"s{sampling.seed + i}", "stop", {"completion_tokens": 1})
                for i in range(n)]  # fmt: skip


# --- the policy -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "greedy", "sampled"),
    [("sampled", False, True), ("all", True, True), ("off", False, False)],
)
def test_the_policy_names_the_calls_that_may_reuse_a_prefix(policy, greedy, sampled):
    assert (reuses_prefix(policy, GREEDY), reuses_prefix(policy, SAMPLED)) == (greedy, sampled)


def test_greedy_calls_keep_the_prompt_cache_off_by_default(tmp_path):
    m = EmbeddedLlama(tmp_path / "m.gguf")
    assert m._fields(GREEDY) == {"cache_prompt": False}
    assert m._fields(SAMPLED) == {"cache_prompt": True}


def test_an_unknown_policy_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="prefix_cache"):
        EmbeddedLlama(tmp_path / "m.gguf", prefix_cache="greedy")
    with pytest.raises(ConfigError, match="prefix_cache"):
        ModelConfig(prefix_cache="greedy").validate()


def test_the_config_switch_reaches_the_embedded_server(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    from whale.models import build_model

    m = build_model(ModelConfig(name=str(gguf), prefix_cache="all", cache=False))
    assert isinstance(m, EmbeddedLlama) and m._fields(GREEDY) == {"cache_prompt": True}


def test_the_server_keeps_its_prompt_cache_off_and_starts_without_fit_or_warm_up(tmp_path):
    """Off by default on the server (a request turns it on for itself); the start skips the
    memory-fitting dry run and the warm-up decode (the adapter-swap path restarts it)."""
    from whale.models import native

    cmd = native.command(tmp_path / "llama-server", tmp_path / "m.gguf", port=1, alias="a",
                         n_ctx=64, slots=2, threads=1)  # fmt: skip
    assert "--no-cache-prompt" in cmd and cmd[cmd.index("--cache-ram") + 1] == "0"
    assert cmd[cmd.index("--fit") + 1] == "off" and "--no-warmup" in cmd


# --- the wire ---------------------------------------------------------------------------


def test_request_fields_are_sent_with_each_call():
    with StubServer([("ok", "x")]) as stub:
        m = OpenAICompatible("m", stub.base_url,
                             request_fields=lambda s: {"cache_prompt": s.temperature > 0})  # fmt: skip
        m.chat(MESSAGES, GREEDY)
        m.chat(MESSAGES, SAMPLED)
        m.close()
    assert [r["cache_prompt"] for r in stub.requests] == [False, True]


def test_chat_choices_is_one_request_and_counts_each_choice_from_its_logprobs():
    with StubServer([("ok", "x")]) as stub:
        m = OpenAICompatible("m", stub.base_url)
        cs = m.chat_choices(MESSAGES, SAMPLED, 3, fields={"n_probs": 1})
        m.close()
    assert len(stub.requests) == 1 and stub.requests[0]["n"] == 3
    assert stub.requests[0]["seed"] == 5 and stub.requests[0]["n_probs"] == 1
    assert [c.text for c in cs] == ["x#0", "x#1", "x#2"]
    assert [c.usage["completion_tokens"] for c in cs] == [1, 2, 3]


def test_chat_choices_without_logprobs_leaves_the_count_out():
    with StubServer([("ok", "x")]) as stub:
        m = OpenAICompatible("m", stub.base_url)
        cs = m.chat_choices(MESSAGES, SAMPLED, 2)
        m.close()
    assert all("completion_tokens" not in c.usage for c in cs)


def test_chat_choices_whose_usage_has_no_prompt_count_are_read():
    reply = {"choices": [{"message": {"content": "a"}, "finish_reason": "stop"},
                         {"message": {"content": "b"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": None, "completion_tokens": 2}}  # fmt: skip
    with StubServer([("json", reply)]) as stub:
        m = OpenAICompatible("m", stub.base_url, retries=0)
        cs = m.chat_choices(MESSAGES, SAMPLED, 2)
        m.close()
    assert [(c.text, c.usage) for c in cs] == [("a", {}), ("b", {})]


def test_chat_choices_refuses_tools():
    tools = Sampling(max_tokens=8, temperature=0.7, tools='[{"type": "function"}]')
    with StubServer([("ok", "x")]) as stub:
        m = OpenAICompatible("m", stub.base_url)
        with pytest.raises(ValueError, match="tools"):
            m.chat_choices(MESSAGES, tools, 2)
        m.close()
    assert stub.requests == []


# --- chat_n over any backend --------------------------------------------------------------


def test_each_asks_one_call_per_seed():
    m = SharingModel()
    assert [c.text for c in each(m, MESSAGES, SAMPLED, 3)] == ["s5", "s6", "s7"]
    assert sorted(m.singles) == [5, 6, 7]


def test_each_keeps_no_seed_as_no_seed():
    m = SharingModel()
    each(m, MESSAGES, Sampling(temperature=0.7, seed=None), 2)
    assert m.singles == [None, None]


def test_chat_n_uses_the_backends_own_and_falls_back_to_single_calls():
    m = SharingModel()
    assert [c.text for c in chat_n(m, MESSAGES, SAMPLED, 2)] == ["s5", "s6"]
    assert m.batches == [(5, 2)] and m.singles == []
    plain = OpenAICompatible("m", "http://127.0.0.1:9/v1")
    assert not shares_prompt(plain, SAMPLED)  # no such method: never
    plain.close()


# --- the response cache ----------------------------------------------------------------------


def test_a_batch_is_cached_under_each_seed_and_answers_single_calls(tmp_path):
    inner = SharingModel()
    m = CachedModel(inner, tmp_path / "c.sqlite")
    assert [c.text for c in m.chat_n(MESSAGES, SAMPLED, 3)] == ["s5", "s6", "s7"]
    one = m.chat(MESSAGES, Sampling(max_tokens=8, temperature=0.7, seed=6))
    assert one.text == "s6" and one.cached and inner.singles == [] and inner.batches == [(5, 3)]


def test_single_calls_already_cached_are_not_asked_again_in_a_batch(tmp_path):
    inner = SharingModel()
    m = CachedModel(inner, tmp_path / "c.sqlite")
    m.chat(MESSAGES, SAMPLED)  # seed 5
    cs = m.chat_n(MESSAGES, SAMPLED, 3)
    assert [c.text for c in cs] == ["s5", "s6", "s7"] and cs[0].cached and not cs[1].cached
    assert inner.batches == [(6, 2)]  # the consecutive run left, in one request


def test_gaps_between_cached_seeds_are_asked_one_by_one(tmp_path):
    inner = SharingModel()
    m = CachedModel(inner, tmp_path / "c.sqlite")
    m.chat(MESSAGES, Sampling(max_tokens=8, temperature=0.7, seed=6))
    assert [c.text for c in m.chat_n(MESSAGES, SAMPLED, 3)] == ["s5", "s6", "s7"]
    assert inner.batches == [] and sorted(inner.singles) == [5, 6, 7]


def test_the_cache_says_what_its_backend_shares(tmp_path):
    m = CachedModel(SharingModel(), tmp_path / "c.sqlite")
    assert m.shares_prompt(SAMPLED) and not m.shares_prompt(GREEDY)


# --- turns: several slots for one request ------------------------------------------------


class SlowTurns(threading.Semaphore):
    """Turns whose taking lets other threads run between two takes (as a busy machine does)."""

    def acquire(self, blocking=True, timeout=None):
        got = super().acquire(blocking, timeout)
        if got:
            time.sleep(0.002)
        return got


def test_requests_taking_several_turns_do_not_deadlock(tmp_path):
    """Each caller needs 3 of the 4 turns: taken one by one without `_many`, two callers
    holding two each would wait for ever."""
    m = EmbeddedLlama(tmp_path / "m.gguf", slots=4)
    m._turns = SlowTurns(4)
    done: list[int] = []

    def caller(i: int) -> None:
        for _ in range(5):
            m._in_turns(3, lambda: time.sleep(0.001))
        done.append(i)

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    m.abort()  # a deadlocked caller polls for close(): let it end
    assert sorted(done) == list(range(6))
    assert all(m._turns.acquire(blocking=False) for _ in range(4))  # every turn given back


def test_a_closed_model_gives_back_the_turns_it_took(tmp_path):
    m = EmbeddedLlama(tmp_path / "m.gguf", slots=4)
    m._turns = threading.Semaphore(4)
    m._turns.acquire()
    m._turns.acquire()  # two busy: a 3-turn call waits
    threading.Timer(0.2, m.abort).start()
    with pytest.raises(ModelError, match="closed"):
        m._in_turns(3, lambda: None)
    m._turns.release()
    m._turns.release()
    assert all(m._turns.acquire(blocking=False) for _ in range(4))


# --- the real native server -------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol():
    from tests.models.test_native_server import require_native

    require_native()
    m = EmbeddedLlama(require_model("smollm2-135m"), alias="smol", n_ctx=512, threads=1, slots=4)
    yield m
    m.close()


@pytest.mark.model
def test_chat_n_shares_the_prompt_for_sampled_calls_only(smol):
    assert smol.shares_prompt(SAMPLED) and not smol.shares_prompt(GREEDY)
    assert not smol.shares_prompt(Sampling(temperature=0.7, seed=None))


@pytest.mark.model
def test_choice_i_of_one_request_is_the_sample_of_seed_plus_i(smol):
    """What lets the response cache key each choice by its seed: llama-server seeds choice i
    with the request's seed + i (compared between requests of the same size, so that both
    decode in the same batches)."""
    story = [{"role": "user", "content": "Tell me a story about a cat."}]
    a = smol.chat_n(story, Sampling(max_tokens=16, temperature=1.0, seed=40), 2)
    b = smol.chat_n(story, Sampling(max_tokens=16, temperature=1.0, seed=41), 2)
    assert a[1].text == b[0].text and a[0].text != a[1].text


@pytest.mark.model
def test_each_choice_counts_its_own_tokens(smol):
    cs = smol.chat_n(MESSAGES, Sampling(max_tokens=6, temperature=1.0, seed=3), 3)
    assert len(cs) == 3
    for c in cs:
        n = c.usage["completion_tokens"]
        assert 0 < n <= 6 and (c.finish_reason != "length" or n == 6)


@pytest.mark.model
def test_more_samples_than_slots_come_in_several_requests(smol):
    cs = smol.chat_n(MESSAGES, Sampling(max_tokens=4, temperature=1.0, seed=9), 6)
    assert len(cs) == 6 and all(c.usage["completion_tokens"] > 0 for c in cs)


@pytest.mark.model
def test_a_speculating_server_answers_single_and_shared_prompt_calls(tmp_path):
    from tests.models.test_native_server import require_native

    require_native()
    m = EmbeddedLlama(require_model("smollm2-135m"), alias="smol", n_ctx=512, threads=1,
                      slots=2, speculative="ngram")  # fmt: skip
    copy = [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, the cat sat "
                                        "on the mat, the cat sat on the mat."}]
    try:
        one = m.chat(copy, Sampling(max_tokens=24, temperature=0.0))
        two = m.chat_n(copy, Sampling(max_tokens=24, temperature=0.7, seed=5), 2)
    finally:
        m.close()
    assert one.usage["completion_tokens"] > 0
    assert len(two) == 2 and all(c.usage["completion_tokens"] > 0 for c in two)


# --- review26 ---------------------------------------------------------------------------------
def test_review26_a_failed_second_request_keeps_the_proposals_the_first_paid_for(tmp_path,
                                                                                  monkeypatch):
    """G = 8 on a 4-slot server is two requests, one after the other. When the second fails
    (a timeout: it ends with its longest sample), the four completions the first request
    returned were dropped: not cached, and every proposal of the round an error, so a rerun
    paid for them again."""
    from whale.revise.proposer import Proposer

    m = EmbeddedLlama(tmp_path / "m.gguf", slots=4)
    asked: list[tuple[int, int]] = []

    class Client:
        def chat_choices(self, messages, sampling, n, timeout=None, fields=None):
            asked.append((sampling.seed, n))
            if sampling.seed >= 104:
                raise ModelError("no reply within 600.0 s")
            return [Completion(f"s{sampling.seed + i}", "stop", {"completion_tokens": 1})
                    for i in range(n)]  # fmt: skip

    monkeypatch.setattr(m, "start", lambda: Client())
    monkeypatch.setattr(m, "shares_prompt", lambda s: True)
    monkeypatch.setattr(m, "_in_turns", lambda k, call: call())
    m.kind = "native"
    cached = CachedModel(m, tmp_path / "cache.sqlite")
    try:
        out = Proposer(cached).propose("prompt", 8, 100)
        assert [p.text for p in out[:4]] == ["s100", "s101", "s102", "s103"]
        assert all(p.error is None for p in out[:4]) and all(p.error for p in out[4:])
        asked.clear()
        again = cached.chat_n([{"role": "user", "content": "prompt"}],
                              Sampling(max_tokens=1024, temperature=0.7, seed=100), 4)
        assert [c.text for c in again] == ["s100", "s101", "s102", "s103"]
    finally:
        cached.close()
    assert asked == []  # the first four came from the cache


# --- seeds a server takes ---------------------------------------------------------------------
def test_no_seed_is_sent_as_llamas_random_value():
    """llama.cpp takes seed 0xFFFFFFFF to mean "random": a seeded call sent that value would
    give a new reply each time, under one cache key."""
    from whale.models.base import SEED_SPACE, wire_seed

    assert wire_seed(5) == 5 and wire_seed(SEED_SPACE - 1) == SEED_SPACE - 1
    for seed in (SEED_SPACE, 2 * SEED_SPACE, 4295 * 1_000_000, -1, 2**64 + 3):
        assert 0 <= wire_seed(seed) < SEED_SPACE


def test_a_seed_past_the_uint32_range_is_sent_inside_it():
    with StubServer([("ok", "fine")]) as s:
        OpenAICompatible("stub", s.base_url).chat(MESSAGES, Sampling(seed=0xFFFFFFFF + 7))
    assert s.requests[0]["seed"] == 7


def test_a_batch_whose_seeds_would_cross_the_random_value_is_asked_one_call_each(
        tmp_path, monkeypatch):
    """The server seeds choice i with the sent seed + i: from 0xFFFFFFFE, choice 1 would get
    the "random" value, so these samples are asked for one by one."""
    m = EmbeddedLlama(tmp_path / "m.gguf", slots=4)
    batched: list[tuple[int, int]] = []
    singles: list[int] = []

    class Client:
        def chat_choices(self, messages, sampling, n, timeout=None, fields=None):
            batched.append((sampling.seed, n))
            return [Completion("x", "stop", {"completion_tokens": 1}) for _ in range(n)]

    def chat(messages, sampling, timeout=None):
        singles.append(sampling.seed)
        return Completion("x", "stop", {"completion_tokens": 1})

    monkeypatch.setattr(m, "start", lambda: Client())
    monkeypatch.setattr(m, "shares_prompt", lambda s: True)
    monkeypatch.setattr(m, "_in_turns", lambda k, call: call())
    monkeypatch.setattr(m, "chat", chat)
    m.kind = "native"
    assert len(m.chat_n(MESSAGES, Sampling(temperature=0.7, seed=0xFFFFFFFE), 2)) == 2
    assert batched == [] and sorted(singles) == [0xFFFFFFFE, 0xFFFFFFFF]
    m.chat_n(MESSAGES, Sampling(temperature=0.7, seed=0xFFFFFFFD), 2)
    assert batched == [(0xFFFFFFFD, 2)]


def test_ngram_speculation_is_one_flag_on_the_native_server_and_off_by_default(tmp_path):
    from whale.models import native

    def cmd(**kw):
        return native.command(tmp_path / "llama-server", tmp_path / "m.gguf", port=1, alias="a",
                              n_ctx=64, slots=2, threads=1, **kw)  # fmt: skip

    assert "--spec-type" not in cmd()
    on = cmd(speculative="ngram")
    assert on[on.index("--spec-type") + 1] == "ngram-simple"


def test_speculation_reaches_the_embedded_server_from_the_config(tmp_path, monkeypatch):
    from whale.models import build_model, native

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(native, "binary", lambda: tmp_path / "llama-server")
    m = build_model(ModelConfig(name=str(gguf), speculative="ngram", cache=False))
    assert isinstance(m, EmbeddedLlama) and "ngram-simple" in m._command("native", 1)


def test_an_unknown_speculation_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="speculative"):
        EmbeddedLlama(tmp_path / "m.gguf", speculative="eagle")
    with pytest.raises(ConfigError, match="speculative"):
        ModelConfig(speculative="eagle").validate()  # type: ignore[arg-type]


def test_the_trained_solver_s_server_speculates_as_its_config_says(tmp_path):
    # cotrain's weight phase serves each adapter on a new server (EmbeddedServing): the
    # solver's `speculative` must reach it as `prefix_cache` does.
    from whale.train.serving import EmbeddedServing

    serving = EmbeddedServing(tmp_path / "m.gguf", "m", speculative="ngram")
    assert serving._model_for(None).speculative == "ngram"
