"""llama.cpp servers never outlive the whale process that started them (issue 8: 11 servers of
~330 MB each were left after 8 kills of `whale`).

Real processes throughout: a real llama server on SmolLM2-135M where one is needed, and real
sleeping processes for the registry's refusals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import require_model
from whale.models import EmbeddedLlama, Sampling, serverproc
from whale.models.embedded import free_port

HI = [{"role": "user", "content": "hi"}]


def gone(pid: int, within_s: float) -> bool:
    """True once `pid` has exited (a zombie counts as exited) within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if stat[stat.rindex(")") + 2] == "Z":
            return True
        time.sleep(0.05)
    return False


def server_cmd(gguf: Path, port: int) -> list[str]:
    return [
        sys.executable, "-m", "whale.models.llama_server", "--model", str(gguf),
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "256", "--n_threads", "1",
        "--model_alias", "stale",
    ]  # fmt: skip


def dead_pid() -> tuple[int, int | None]:
    """The pid and start time of a process that has exited (an owner that was killed)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    started = serverproc.start_time(p.pid)
    p.wait()
    return p.pid, started


def plant(folder: Path, owner: tuple[int, int | None], pid: int, cmd: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{pid}.json"
    path.write_text(json.dumps({
        "owner_pid": owner[0], "owner_start": owner[1], "server_pid": pid,
        "server_start": serverproc.start_time(pid), "cmdline": cmd,
    }))  # fmt: skip
    return path


@pytest.fixture
def registry(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "servers"
    monkeypatch.setattr(serverproc, "registry_dir", lambda: folder)
    return folder


@pytest.fixture
def sleeper(tmp_path):
    """Start a harmless sleeping process; `server=True` gives it the command line of an
    embedded server (`python -m llama_cpp.server ARGS`, a stand-in module that sleeps)."""
    fake = tmp_path / "fake"
    (fake / "llama_cpp").mkdir(parents=True)
    (fake / "llama_cpp" / "__init__.py").write_text("")
    (fake / "llama_cpp" / "server.py").write_text("import time\ntime.sleep(60)\n")
    procs: list[subprocess.Popen[bytes]] = []

    def start(*argv: str, server: bool = False) -> tuple[subprocess.Popen[bytes], list[str]]:
        head = ["-m", "llama_cpp.server"] if server else ["-c", "import time; time.sleep(60)"]
        cmd = [sys.executable, *head, *argv]
        p = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(fake)})
        procs.append(p)
        deadline = time.monotonic() + 10
        while serverproc.cmdline(p.pid) != cmd and time.monotonic() < deadline:
            time.sleep(0.01)  # until its exec is done
        return p, cmd

    yield start
    for p in procs:
        p.kill()
        p.wait()


# --- parent-death signal ------------------------------------------------------------------

OWNER = textwrap.dedent("""
    import sys, time
    from whale.models import EmbeddedLlama, Sampling
    m = EmbeddedLlama(sys.argv[1], n_ctx=256, threads=1)
    m.chat([{"role": "user", "content": "hi"}], Sampling(max_tokens=2))
    print(m._proc.pid, flush=True)
    time.sleep(120)
""")


@pytest.mark.model
def test_kill_9_of_the_owner_kills_its_server(registry):
    gguf = require_model("smollm2-135m")
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(gguf)], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    server = int(owner.stdout.readline() or 0)
    try:
        assert server and not gone(server, 0.2)  # it is up and answered
        owner.kill()  # kill -9: no atexit, no close()
        owner.wait()
        assert gone(server, 5.0), "the llama server outlived its owner's kill -9"
    finally:
        owner.kill()
        owner.wait()
        if server and not gone(server, 0):
            serverproc.kill_group(server)


@pytest.mark.model
def test_a_server_started_from_a_pool_thread_outlives_that_thread(registry):
    # The parent-death signal follows the thread that forked. The first call of a run comes
    # from an evaluate() pool thread that ends with the pool; the server must not die then.
    m = EmbeddedLlama(require_model("smollm2-135m"), n_ctx=256, threads=1)
    try:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(m.chat, HI, Sampling(max_tokens=2)).result()
        time.sleep(0.5)
        assert m._proc is not None and m._proc.poll() is None
        assert m.chat(HI, Sampling(max_tokens=2)).text is not None
    finally:
        m.close()


# --- registry and reaping -----------------------------------------------------------------


@pytest.mark.model
def test_a_stale_server_of_a_dead_owner_is_reaped_when_a_new_one_starts(registry):
    gguf = require_model("smollm2-135m")
    port = free_port()
    cmd = server_cmd(gguf, port)
    # A server with no parent-death signal (an older whale, or a signal that never came),
    # whose owner is gone: exactly what 8 kills of `whale` left behind.
    stale = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        record = plant(registry, dead_pid(), stale.pid, cmd)
        m = EmbeddedLlama(gguf, n_ctx=256, threads=1)
        try:
            m.start()
            assert stale.wait(timeout=5) == -signal.SIGKILL
            assert not record.exists()
            mine = registry / f"{m._proc.pid}.json"  # type: ignore[union-attr]
            assert json.loads(mine.read_text())["owner_pid"] == os.getpid()
        finally:
            m.close()
        assert not mine.exists()  # close() removes its own record
    finally:
        stale.kill()
        stale.wait()


def test_reaper_kills_a_matching_server_of_a_dead_owner(registry, sleeper):
    p, cmd = sleeper("--port", "1", server=True)
    record = plant(registry, dead_pid(), p.pid, cmd)
    assert serverproc.reap_stale() == [p.pid]
    assert p.wait(timeout=5) == -signal.SIGKILL and not record.exists()


def test_reaper_spares_a_live_owners_server(registry, sleeper):
    p, cmd = sleeper("--port", "1", server=True)
    record = plant(registry, (os.getpid(), serverproc.start_time(os.getpid())), p.pid, cmd)
    assert serverproc.reap_stale() == []
    assert p.poll() is None and record.exists()


def test_reaper_spares_a_process_that_is_not_an_embedded_server(registry, sleeper):
    # The recorded pid runs something else with exactly the recorded command line: only
    # embedded llama servers are ever killed.
    p, cmd = sleeper("--model", "x.gguf")
    record = plant(registry, dead_pid(), p.pid, cmd)
    assert serverproc.reap_stale() == []
    assert p.poll() is None and not record.exists()


def test_reaper_spares_a_server_whose_command_line_differs(registry, sleeper):
    p, cmd = sleeper("--port", "1", server=True)
    record = plant(registry, dead_pid(), p.pid, [*cmd[:-1], "2"])
    assert serverproc.reap_stale() == []
    assert p.poll() is None and not record.exists()


def test_reaper_spares_a_reused_pid(registry, sleeper):
    # Same pid and command line, another start time: the pid was reused.
    p, cmd = sleeper("--port", "1", server=True)
    record = plant(registry, dead_pid(), p.pid, cmd)
    rec = json.loads(record.read_text())
    record.write_text(json.dumps({**rec, "server_start": rec["server_start"] - 1}))
    assert serverproc.reap_stale() == []
    assert p.poll() is None and not record.exists()


def test_reaper_removes_malformed_records(registry):
    registry.mkdir()
    (registry / "1.json").write_text("{torn")
    assert serverproc.reap_stale() == [] and not (registry / "1.json").exists()
