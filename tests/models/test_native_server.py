"""The embedded backend on the native llama-server (issue 13): parallel slots, continuous
batching, the same process lifetime as the python server.

Real processes throughout: the real binary that `make install` builds, on SmolLM2-135M, and a
real sleeping process for the reaper's check of a native command line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import require_model
from tests.models.test_server_cleanup import dead_pid, gone, plant
from whale.models import EmbeddedLlama, ModelError, Sampling, native, serverproc
from whale.models.embedded import server_kind

HI = [{"role": "user", "content": "hi"}]
LONG = Sampling(max_tokens=48, temperature=0.0)
TOPICS = ["the sea", "a mountain", "a city at night", "an old library", "the desert"]


def essay(topic: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a long story about {topic}."}]


def require_native() -> Path:
    """The built binary. `make install` builds it; a missing one is a failure (not a skip)
    unless WHALE_SKIP_MODEL_TESTS=1."""
    exe = native.binary()
    if exe is None:
        if os.environ.get("WHALE_SKIP_MODEL_TESTS") == "1":
            pytest.skip("native llama-server not built and WHALE_SKIP_MODEL_TESTS=1")
        pytest.fail(f"no native llama-server at {native.candidates()[0]}: run `make llama-server`")
    return exe


@pytest.fixture(scope="module")
def smol():
    require_native()
    m = EmbeddedLlama(require_model("smollm2-135m"), alias="smol", n_ctx=512, threads=1, slots=4)
    yield m
    m.close()


# --- without a model ----------------------------------------------------------------------


def test_native_command_lines_are_recognized_and_nothing_else():
    exe = "/home/u/.cache/whale/bin/llama-server-0.3.36"
    assert serverproc.is_server_cmd([exe, "--model", "m.gguf", "--port", "1"])
    assert serverproc.is_server_cmd(["/usr/local/bin/llama-server", "--model", "m.gguf"])
    assert not serverproc.is_server_cmd([exe, "--version"])  # not serving a model
    assert not serverproc.is_server_cmd(["/usr/bin/llama-serverless", "--model", "m.gguf"])
    assert not serverproc.is_server_cmd(["/bin/sleep", "--model", "llama-server"])


def test_repacking_follows_the_amx_switch(monkeypatch, tmp_path):
    def cmd() -> list[str]:
        return native.command(tmp_path / "x", tmp_path / "m.gguf", port=1, alias="a", n_ctx=512,
                              slots=3, threads=2, lora=tmp_path / "l.gguf")  # fmt: skip

    monkeypatch.setenv("WHALE_LLAMA_EXTRA_BUFTS", "0")  # off, as on AMX CPUs
    c = cmd()
    assert "--no-repack" in c and c[c.index("--ctx-size") + 1] == "1536"
    assert c[c.index("--lora") + 1] == str(tmp_path / "l.gguf") and "127.0.0.1" in c
    monkeypatch.setenv("WHALE_LLAMA_EXTRA_BUFTS", "1")
    assert "--no-repack" not in cmd()


def test_forced_server_kind(monkeypatch):
    monkeypatch.setenv("WHALE_EMBEDDED_SERVER", "python")
    assert server_kind() == "python" and server_kind("native") == "native"
    monkeypatch.setenv("WHALE_EMBEDDED_SERVER", "vllm")
    with pytest.raises(ModelError, match="expected 'native' or 'python'"):
        server_kind()


def test_without_the_binary_the_python_server_is_used_and_says_so(monkeypatch, tmp_path, capsys):
    from whale.models import embedded

    monkeypatch.delenv("WHALE_EMBEDDED_SERVER", raising=False)
    monkeypatch.setenv("WHALE_LLAMA_SERVER", str(tmp_path / "nope"))
    monkeypatch.setattr(embedded, "_warned_python", False)
    assert server_kind() == "python" and server_kind() == "python"
    err = capsys.readouterr().err
    assert err.count("make llama-server") == 1 and str(tmp_path / "nope") in err


def test_a_missing_forced_binary_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("WHALE_LLAMA_SERVER", str(tmp_path / "nope"))
    m = EmbeddedLlama(tmp_path / "m.gguf", server="native")
    (tmp_path / "m.gguf").write_bytes(b"")
    with pytest.raises(ModelError, match="make llama-server"):
        m.start()
    assert not m.started


def test_reaper_kills_a_native_server_of_a_dead_owner(tmp_path, monkeypatch):
    # A process whose command line is a native server's (python, under the binary's name).
    monkeypatch.setattr(serverproc, "registry_dir", lambda: tmp_path / "servers")
    exe = tmp_path / native.BINARY_NAME
    exe.symlink_to(sys.executable)
    cmd = [str(exe), "-c", "import time; time.sleep(60)", "--model", "x.gguf"]
    p = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 10
        while serverproc.cmdline(p.pid) != cmd and time.monotonic() < deadline:
            time.sleep(0.01)
        record = plant(tmp_path / "servers", dead_pid(), p.pid, cmd)
        assert serverproc.reap_stale() == [p.pid]
        assert p.wait(timeout=5) == -9 and not record.exists()
    finally:
        p.kill()
        p.wait()


# --- the real server ----------------------------------------------------------------------


@pytest.mark.model
def test_the_native_server_is_used_and_answers(smol):
    exe = require_native()
    c = smol.chat(HI, Sampling(max_tokens=4))
    assert smol.kind == "native" and smol._proc is not None
    assert serverproc.cmdline(smol._proc.pid)[0] == str(exe)  # type: ignore[index]
    assert c.finish_reason == "length" and c.usage["completion_tokens"] == 4


@pytest.mark.model
def test_the_python_server_still_serves_when_forced(monkeypatch):
    monkeypatch.setenv("WHALE_EMBEDDED_SERVER", "python")
    m = EmbeddedLlama(require_model("smollm2-135m"), n_ctx=256, threads=1)
    try:
        c = m.chat(HI, Sampling(max_tokens=3))
        assert m.kind == "python" and m._proc is not None
        assert (serverproc.cmdline(m._proc.pid) or [])[1:3] == ["-m", "whale.models.llama_server"]
        assert c.finish_reason == "length" and c.usage["completion_tokens"] == 3
    finally:
        m.close()


@pytest.mark.model
def test_four_concurrent_chats_are_served_together_and_each_as_alone(smol):
    # Four concurrent greedy chats: each gets the reply it gets alone, and the server ran
    # them on its four parallel slots. How much faster that is than one at a time is a
    # speed figure of the CPU, not a property: benchmarks/embedded_concurrency.py prints it.
    alone = {p: smol.chat(essay(p), LONG).text for p in TOPICS[:4]}
    assert smol.log_path is not None
    log_start = smol.log_path.stat().st_size
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: smol.chat(essay(p), LONG), TOPICS[:4]))
    assert all(c.usage["completion_tokens"] == 48 for c in together)
    assert [c.text for c in together] == [alone[p] for p in TOPICS[:4]]
    log = smol.log_path.read_bytes()[log_start:].decode(errors="replace")
    slots = set(re.findall(r"slot\s+launch_slot_: id\s+(\d+)", log))
    assert len(slots) == 4, f"slots used: {slots}"


@pytest.mark.model
def test_a_repeated_request_gets_the_same_reply():
    # With prompt caching on, the second request is answered from the cached KV plus a
    # one-token re-evaluation, and its reply may differ (measured with `--cache-prompt` on this
    # model and prompt: the greedy and the seeded replies both changed on the repeat); the
    # response cache assumes they do not.
    require_native()
    m = EmbeddedLlama(require_model("qwen-coder-0.5b"), n_ctx=256, threads=1, slots=1)
    word = [{"role": "user", "content": "Tell me a random word."}]
    try:
        for sampling in (Sampling(max_tokens=24), Sampling(max_tokens=24, temperature=1.0)):
            assert m.chat(word, sampling).text == m.chat(word, sampling).text, sampling
    finally:
        m.close()


@pytest.mark.model
def test_calls_beyond_the_slots_wait_without_spending_their_timeout():
    # 1 slot, 3 calls of T s each with a 2.5 T timeout: the third waits 2 T for its turn and
    # must still finish (its timeout counts its own decoding only).
    require_native()
    m = EmbeddedLlama(require_model("smollm2-135m"), n_ctx=256, threads=1, slots=1)
    try:
        m.chat(HI, Sampling(max_tokens=2))
        t = time.perf_counter()
        m.chat(essay("a cat"), Sampling(max_tokens=16))
        each = time.perf_counter() - t
        timeout = max(2.5, 2.5 * each)
        with ThreadPoolExecutor(3) as pool:
            futs = [
                pool.submit(m.chat, essay(p), Sampling(max_tokens=16), timeout) for p in TOPICS[:3]
            ]
            done = [f.result() for f in futs]
        assert all(c.usage["completion_tokens"] == 16 for c in done)
    finally:
        m.close()


OWNER = textwrap.dedent("""
    import json, sys, time
    from whale.models import EmbeddedLlama, Sampling
    m = EmbeddedLlama(sys.argv[1], n_ctx=256, threads=1, slots=2)
    m.chat([{"role": "user", "content": "hi"}], Sampling(max_tokens=2))
    print(json.dumps([m.kind, m._proc.pid]), flush=True)
    time.sleep(120)
""")


@pytest.mark.model
def test_kill_9_of_the_owner_kills_its_native_server(tmp_path):
    require_native()
    env = {**os.environ, "WHALE_CACHE": str(tmp_path)}  # its registry record lands here
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(require_model("smollm2-135m"))],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert owner.stdout is not None
    kind, server = json.loads(owner.stdout.readline() or '[null, 0]')
    try:
        assert kind == "native" and server and not gone(server, 0.2)
        assert native.is_native_cmd(serverproc.cmdline(server) or [])
        owner.kill()  # kill -9: no atexit, no close()
        owner.wait()
        assert gone(server, 5.0), "the native llama-server outlived its owner's kill -9"
    finally:
        owner.kill()
        owner.wait()
        if server and not gone(server, 0):
            serverproc.kill_group(server)


@pytest.mark.model
def test_close_kills_the_server_fails_waiting_calls_and_refuses_later_ones():
    require_native()
    m = EmbeddedLlama(require_model("smollm2-135m"), n_ctx=512, threads=1, slots=2)
    m.start()
    assert m._proc is not None
    pid = m._proc.pid
    errors: list[BaseException] = []

    def call() -> None:
        try:
            m.chat(essay("a long war"), Sampling(max_tokens=400))
        except ModelError as e:
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(4)]  # 2 decoding, 2 waiting
    for t in threads:
        t.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    m.close()
    for t in threads:
        t.join(timeout=10)
    took = time.monotonic() - t0
    # Each call asked for 400 tokens: one that was waited out would have returned its reply,
    # so four errors say close() cut them (the joins' 10 s only guard against a hang).
    assert not any(t.is_alive() for t in threads), f"still running {took:.1f} s after close()"
    assert len(errors) == 4, f"{len(errors)} calls failed"
    assert gone(pid, 2.0)
    with pytest.raises(ModelError, match="closed"):
        m.chat(HI, Sampling(max_tokens=2))
    assert m._proc is None and not m.started


@pytest.mark.model
@pytest.mark.slow
def test_a_lora_adapter_is_applied(tmp_path, smol):
    from tests.train.test_lora_gguf import save_random_adapter
    from whale.train.checkpoint import trainable_checkpoint
    from whale.train.lora_gguf import adapter_to_gguf

    require_native()
    ad = save_random_adapter(
        trainable_checkpoint("smollm2-135m"), tmp_path / "ad", std=0.5, r=4, alpha=8
    )
    lora = adapter_to_gguf(ad)
    tuned = EmbeddedLlama(
        require_model("smollm2-135m"), alias="smol", n_ctx=512, threads=1, slots=2, lora=lora
    )
    try:
        sampling = Sampling(max_tokens=16)
        with ThreadPoolExecutor(2) as pool:  # two slots, both with the adapter
            a, b = pool.map(lambda p: tuned.chat(essay(p), sampling), TOPICS[:2])
        assert tuned.kind == "native" and "--lora" in (serverproc.cmdline(tuned._proc.pid) or [])
        assert tuned.name.startswith("embedded:smol+")
        assert a.text != smol.chat(essay(TOPICS[0]), sampling).text
        assert b.text != smol.chat(essay(TOPICS[1]), sampling).text
    finally:
        tuned.close()


@pytest.mark.model
def test_a_server_that_dies_under_a_call_is_named_and_the_next_call_starts_a_new_one():
    """A crash or an OOM kill of the server: the call says the server exited (not "cannot
    reach"), and the instance does not keep refusing: the next call restarts it."""
    import signal
    import threading

    require_native()
    m = EmbeddedLlama(require_model("smollm2-135m"), n_ctx=512, threads=1, slots=2)
    try:
        assert m.chat(HI, Sampling(max_tokens=4)).text is not None
        proc = m._proc
        assert proc is not None
        timer = threading.Timer(0.3, lambda: os.killpg(proc.pid, signal.SIGKILL))
        timer.start()
        with pytest.raises(ModelError, match=r"server exited \(-9\) during the call"):
            m.chat(essay("the sea"), Sampling(max_tokens=400))
        timer.join()
        again = m.chat(HI, Sampling(max_tokens=4))
        assert again.text is not None and m._proc is not None and m._proc.pid != proc.pid
    finally:
        m.close()


def test_a_binary_of_another_name_is_recognized_and_a_non_executable_one_is_named(
        monkeypatch, tmp_path):  # fmt: skip
    exe = tmp_path / "server"
    exe.write_text("#!/bin/sh\n")
    monkeypatch.setenv("WHALE_LLAMA_SERVER", str(exe))
    assert native.binary() is None and "is not executable" in native.missing()
    exe.chmod(0o755)
    cmd = native.command(exe, tmp_path / "m.gguf", port=1, alias="a", n_ctx=8, slots=1,
                         threads=1)  # fmt: skip
    assert serverproc.is_server_cmd(cmd)  # so the reaper finds it when its owner is gone
    assert not serverproc.is_server_cmd([str(exe), "--help"])
