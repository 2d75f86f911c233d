"""The fleet router against local servers: StubServers in this process for routing and error
handling, and real server processes (tests/fleet_server.py) for a server killed mid-batch."""

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.servers import StubServer
from whale.config import ConfigError, load
from whale.metaharness.run import SearchConfig
from whale.models import (
    CachedModel,
    ContextOverflow,
    Fleet,
    ModelConfig,
    ModelError,
    ModelTimeout,
    ModelUnreachable,
    OpenAICompatible,
    Sampling,
    build_model,
)
from whale.models.embedded import free_port

MSG = [{"role": "user", "content": "hi"}]
ROOT = Path(__file__).resolve().parents[2]


def fleet(*servers, **kw):
    kw.setdefault("retries", 0)
    kw.setdefault("probe_s", 30.0)  # no probe in a test unless it asks for one
    urls = [s if isinstance(s, str) else s.base_url for s in servers]
    return Fleet("stub", urls, **kw)


def batch(model, n, workers=8, timeout=10.0):
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda _: model.chat(MSG, Sampling(), timeout), range(n)))


def most_at_once(spans):
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def test_spreads_load_over_two_endpoints():
    with StubServer([("ok", "a")], delay_s=0.1) as a, StubServer([("ok", "b")], delay_s=0.1) as b:
        f = fleet(a, b)
        texts = [c.text for c in batch(f, 20)]
        f.close()
    assert 8 <= len(a.requests) <= 12 and len(a.requests) + len(b.requests) == 20
    assert texts.count("a") == len(a.requests)
    assert [s["served"] for s in f.stats()] == [len(a.requests), len(b.requests)]


def test_ties_go_round_robin_and_served_by_names_the_endpoint():
    with StubServer([("ok", "a")]) as a, StubServer([("ok", "b")]) as b:
        f = fleet(a, b)
        seen = []
        for _ in range(4):
            f.chat(MSG, Sampling())
            seen.append(f.served_by)
        f.close()
    assert seen == [a.base_url, b.base_url, a.base_url, b.base_url]


def test_per_endpoint_limit_caps_calls_in_flight():
    with StubServer(delay_s=0.1) as a, StubServer(delay_s=0.1) as b:
        f = fleet(a, b, max_concurrency=1)
        t0 = time.monotonic()
        assert len(batch(f, 10)) == 10
        took = time.monotonic() - t0
        f.close()
    assert a.max_in_flight == 1 and b.max_in_flight == 1
    assert most_at_once(a.spans + b.spans) == 2
    assert took >= 0.45  # 10 calls through 2 slots of 0.1 s each


def test_waiting_for_a_slot_counts_against_the_timeout():
    with StubServer(delay_s=0.8) as a, StubServer(delay_s=0.8) as b:
        f = fleet(a, b, max_concurrency=1)
        with ThreadPoolExecutor(2) as pool:
            busy = [pool.submit(f.chat, MSG, Sampling(), 5.0) for _ in range(2)]
            time.sleep(0.2)
            t0 = time.monotonic()
            with pytest.raises(ModelTimeout, match="every endpoint stayed busy"):
                f.chat(MSG, Sampling(), 0.3)
            waited = time.monotonic() - t0
            assert all(c.result().text == "hello" for c in busy)
        f.close()
    # It waited its timeout (a lower bound: no CPU makes a sleep shorter) and was never sent:
    # had the wait not counted, it would have got a slot after 0.6 s and made a third request.
    assert waited >= 0.25 and len(a.requests) + len(b.requests) == 2


@pytest.mark.parametrize("fault", [("status", 500, "boom"), ("status", 503, "busy"), ("close",)])
def test_server_fault_fails_over_at_once_and_marks_the_endpoint_down(fault):
    with StubServer([fault]) as a, StubServer([("ok", "b")]) as b:
        f = fleet(a, b)
        assert [c.text for c in batch(f, 3, workers=1)] == ["b", "b", "b"]
        stats = f.stats()
        f.close()
    assert len(a.requests) == 1 and len(b.requests) == 3
    assert stats[0]["up"] is False and stats[0]["failures"] == 1 and stats[1]["up"] is True
    assert stats[0]["last_error"]


@pytest.mark.parametrize(
    "reply, error",
    [
        (("status", 400, "bad temperature"), ModelError),
        (("status", 400, "Requested tokens exceed context window of 4096"), ContextOverflow),
    ],
)
def test_caller_errors_are_not_retried_elsewhere(reply, error):
    with StubServer([reply]) as a, StubServer([("ok", "b")]) as b:
        f = fleet(a, b, retries=2)
        with pytest.raises(error):
            f.chat(MSG, Sampling())  # the first call goes to the first endpoint
        stats = f.stats()
        f.close()
    assert len(a.requests) == 1 and b.requests == []
    assert stats[0]["up"] is True and stats[0]["errors"] == 1 and stats[0]["failures"] == 0


def test_an_endpoint_without_the_model_is_taken_out_and_the_call_fails_over():
    """A 404 for the model is that endpoint's problem (it serves something else), not the
    caller's: routing 1/N of the calls there forever would fail 1/N of the rollouts."""
    with StubServer([("status", 404, "The model `stub` does not exist")]) as a, \
            StubServer([("ok", "b")]) as b:  # fmt: skip
        f = fleet(a, b)
        assert [c.text for c in batch(f, 3, workers=1)] == ["b", "b", "b"]
        stats = f.stats()
        f.close()
    assert len(a.requests) == 1 and stats[0]["up"] is False


def test_model_missing_everywhere_ends_as_unreachable_naming_the_404s():
    with StubServer([("status", 404, "The model `stub` does not exist")]) as a, \
            StubServer([("status", 404, "The model `stub` does not exist")]) as b:  # fmt: skip
        f = fleet(a, b, probe_s=0.05)
        with pytest.raises(ModelUnreachable, match="does not exist"):
            f.chat(MSG, Sampling(), 1.0)
        f.close()


class _Garbage(BaseHTTPRequestHandler):
    """200 replies that are not chat completions: `/v1/json` invalid JSON, else HTML."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._send(b'{"object": "list", "data": []}', "application/json")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.server.kind == "json":
            self._send(b'{"choices": [', "application/json")
        else:
            self._send(b"<html>hello</html>", "text/html")

    def _send(self, body, ctype):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("kind", ["json", "html"])
def test_a_garbage_reply_is_a_server_fault_that_fails_over(kind):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    srv.kind = kind
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with StubServer([("ok", "b")]) as b:
            bad = f"http://127.0.0.1:{srv.server_address[1]}/v1"
            f = fleet(bad, b)
            assert [c.text for c in batch(f, 2, workers=1)] == ["b", "b"]
            stats = f.stats()
            f.close()
            plain = OpenAICompatible("stub", bad, retries=0)
            with pytest.raises(ModelError, match="not a chat completion"):
                plain.chat(MSG, Sampling())
            plain.close()
    finally:
        srv.shutdown()
        srv.server_close()
    assert stats[0]["up"] is False


def test_every_endpoint_down_names_both_after_waiting_the_timeout():
    urls = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    f = fleet(*urls, probe_s=0.1)
    t0 = time.monotonic()
    with pytest.raises(ModelUnreachable, match="every endpoint is down") as e:
        f.chat(MSG, Sampling(), 0.6)
    waited = time.monotonic() - t0
    prober = f._prober
    f.close()
    assert all(u in str(e.value) for u in urls) and "cannot reach" in str(e.value)
    assert 0.55 <= waited < 30.0  # its timeout, then it gave up (the upper bound: a hang guard)
    assert prober is not None and not prober.is_alive()  # close() ended the probe thread


def test_refuse_fails_a_waiting_call_and_every_later_one_at_once():
    with StubServer(delay_s=0.6) as a, StubServer(delay_s=0.6) as b:
        f = fleet(a, b, max_concurrency=1)
        errors: list[BaseException] = []

        def wait_for_slot():
            try:
                f.chat(MSG, Sampling(), 10.0)
            except ModelError as e:
                errors.append(e)

        with ThreadPoolExecutor(2) as pool:
            busy = [pool.submit(f.chat, MSG, Sampling(), 10.0) for _ in range(2)]
            time.sleep(0.1)
            waiter = threading.Thread(target=wait_for_slot)
            waiter.start()
            time.sleep(0.1)
            t0 = time.monotonic()
            f.refuse()
            waiter.join(timeout=30.0)  # a guard against a hang
            refused_in = time.monotonic() - t0
            with pytest.raises(ModelError, match="closed"):
                f.chat(MSG, Sampling())
            for c in busy:
                c.exception()
        f.close()
    # Refused, not served: a waiter let through would have made a third request when a slot
    # freed (0.5 s later), and the later call a fourth.
    assert not waiter.is_alive(), f"still waiting {refused_in:.1f} s after refuse()"
    assert len(errors) == 1 and "closed" in str(errors[0])
    assert len(a.requests) + len(b.requests) == 2


# --- real server processes -------------------------------------------------------------


def start_server(port: int, delay_s: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fleet_server", str(port), str(delay_s)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == f"http://127.0.0.1:{port}/v1"
    return proc


def wait_until(check, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_survives_a_server_killed_mid_batch_and_takes_it_back_when_it_returns():
    ports = [free_port(), free_port()]
    procs = [start_server(p, 0.2) for p in ports]
    f = Fleet("stub", [f"http://127.0.0.1:{p}/v1" for p in ports], probe_s=0.2, timeout_s=10.0)
    try:
        with ThreadPoolExecutor(8) as pool:
            calls = [pool.submit(f.chat, MSG, Sampling(), 10.0) for _ in range(24)]
            # kill the first server once it has answered and while it has calls in flight
            assert wait_until(lambda: (s := f.stats()[0])["served"] and s["in_flight"], 5.0)
            os.kill(procs[0].pid, signal.SIGKILL)
            procs[0].wait()
            texts = [c.result().text for c in calls]  # raises if any call failed
        first, second = f"port {ports[0]}", f"port {ports[1]}"
        assert set(texts) == {first, second} and len(texts) == 24
        stats = f.stats()
        assert texts.count(first) == stats[0]["served"] and stats[0]["calls"] > stats[0]["served"]
        assert stats[0]["up"] is False and stats[0]["failures"] >= 1  # its calls in flight
        assert stats[0]["in_flight"] == 0 and stats[1]["up"] is True

        procs[0] = start_server(ports[0], 0.2)
        assert wait_until(lambda: f.stats()[0]["up"], 5.0), f.stats()
        assert first in {c.text for c in batch(f, 8)}
    finally:
        f.close()
        for p in procs:
            p.kill()
            p.wait()


# --- config ------------------------------------------------------------------------------


def test_build_model_makes_a_fleet_with_two_endpoints_and_a_client_with_one(tmp_path):
    with StubServer([("ok", "a")]) as a, StubServer([("ok", "b")]) as b:
        cfg = ModelConfig(name="stub", endpoints=[a.base_url, b.base_url], max_concurrency=2,
                          retries=4, cache_path=str(tmp_path / "c.sqlite"))  # fmt: skip
        cfg.validate()
        m = build_model(cfg)
        assert isinstance(m, CachedModel) and isinstance(m.inner, Fleet)
        assert m.name == "fleet:stub" and m.inner.max_concurrency == 2
        assert all(e.client.retries == 1 for e in m.inner._eps)  # fast failover
        assert m.chat(MSG, Sampling()).text == "a" and m.chat(MSG, Sampling()).cached
        m.close()
        one = build_model(ModelConfig(name="stub", endpoints=[a.base_url + "/"], cache=False))
        assert isinstance(one, OpenAICompatible) and one.base_url == a.base_url
        # the cache key does not move when an endpoint is added
        more = build_model(ModelConfig(name="stub", endpoints=[a.base_url, b.base_url,
                                                               "http://127.0.0.1:9/v1"],
                                       cache=False))  # fmt: skip
        assert more.name == "fleet:stub"


def test_endpoints_come_from_toml_and_overrides_for_every_role(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(
        '[solver]\nname = "qwen"\nendpoints = ["http://10.0.0.1:8000/v1", '
        '"http://10.0.0.2:8000/v1"]\nmax_concurrency = 4\n'
        '[proposer]\nname = "big"\nendpoints = ["https://a.example/v1", "https://b.example/v1"]\n'
    )
    cfg = load(SearchConfig, toml, ["proposer.probe_s=1.5"])
    assert cfg.solver.endpoints == ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    assert cfg.solver.max_concurrency == 4 and cfg.proposer.probe_s == 1.5
    assert cfg.proposer.timeout_s == 600.0  # the role's own defaults are kept
    cfg = load(SearchConfig, None, ['solver.endpoints=["http://h1/v1", "http://h2/v1"]'])
    assert cfg.solver.endpoints == ["http://h1/v1", "http://h2/v1"]


@pytest.mark.parametrize(
    "override, message",
    [
        ('solver.endpoints=["ftp://h/v1", "http://h2/v1"]', "not an http"),
        ('solver.endpoints=["http://h/v1", "http://h/v1/"]', "listed twice"),
        ('solver.endpoints=["http://h:99999/v1", "http://h2/v1"]', "not a URL"),
        ('solver.endpoints=["http:///v1", "http://h2/v1"]', "not an http"),
        ("solver.endpoints=[1, 2]", "expected a list of a string"),
        ("solver.max_concurrency=-1", "at least 0"),
        ("solver.max_concurrency=2", "needs 2\\+ endpoints"),
        ("solver.probe_s=0", "greater than 0"),
    ],
)
def test_bad_fleet_configs_are_refused_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message) as e:
        load(SearchConfig, None, [override])
    assert "solver." in str(e.value)


def test_endpoints_and_base_url_together_are_refused():
    with pytest.raises(ConfigError, match="not both"):
        load(SearchConfig, None, ["solver.base_url=http://x/v1",
                                  'solver.endpoints=["http://h1/v1", "http://h2/v1"]'])  # fmt: skip
