"""A fleet endpoint that accepts calls and never answers (issue 20): it is marked down, and
with `attempt_timeout_s` the call fails over. The hung server is a listening socket on
127.0.0.1 that never reads: the kernel accepts the connection, no reply ever comes."""

import socket
import time
from contextlib import contextmanager

import pytest

from tests.servers import StubServer
from whale.models import Fleet, ModelTimeout, Sampling

MSG = [{"role": "user", "content": "hi"}]


@contextmanager
def hung_server():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(64)  # connections complete in the backlog; nothing is ever read or sent
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    finally:
        s.close()


def wait_until(cond, limit_s=20.0):
    end = time.monotonic() + limit_s  # a guard against a hang, not a speed bound
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_a_hung_endpoint_is_marked_down_after_a_call_times_out_on_it():
    with hung_server() as hung, StubServer([("ok", "from the live one")]) as live:
        f = Fleet("stub", [hung, live.base_url], retries=0, probe_s=0.5)
        try:
            with pytest.raises(ModelTimeout):
                f.chat(MSG, Sampling(), 0.5)  # round robin: the hung endpoint first
            assert wait_until(lambda: not f.stats()[0]["up"])
            later = [f.chat(MSG, Sampling(), 5.0).text for _ in range(3)]
            stats = f.stats()
        finally:
            f.close()
    assert later == ["from the live one"] * 3
    assert stats[0]["up"] is False and "timed out" in stats[0]["last_error"]
    assert stats[1]["served"] == 3


def test_a_slow_endpoint_that_answers_the_probe_stays_up():
    with StubServer([("ok", "slow")], delay_s=1.0) as slow:
        f = Fleet("stub", [slow.base_url], retries=0, probe_s=0.5)
        try:
            with pytest.raises(ModelTimeout):
                f.chat(MSG, Sampling(), 0.3)  # the caller's own short timeout
            deadline = time.monotonic() + 30  # a hang guard: the probe goes out at once
            while slow.gets == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)  # its answer handled
            probed, up = slow.gets, f.stats()[0]["up"]
        finally:
            f.close()
    assert probed >= 1  # the timeout did have the endpoint probed ...
    assert up is True  # ... and the answer kept it up


def test_with_an_attempt_timeout_the_call_fails_over_from_a_hung_endpoint():
    with hung_server() as hung, StubServer([("ok", "from the live one")]) as live:
        f = Fleet("stub", [hung, live.base_url], retries=0, probe_s=30.0,
                  attempt_timeout_s=0.5)  # fmt: skip
        try:
            c = f.chat(MSG, Sampling(), 30.0)
            served_by, stats = f.served_by, f.stats()
        finally:
            f.close()
    assert c.text == "from the live one" and served_by == live.base_url.rstrip("/")
    assert stats[0]["up"] is False and "attempt_timeout_s" in stats[0]["last_error"]


def test_attempt_timeout_comes_from_the_model_config_and_must_not_be_negative():
    from whale.config import ConfigError, load
    from whale.models import ModelConfig, build_model

    urls = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
    f = build_model(ModelConfig(name="stub", endpoints=urls, cache=False, attempt_timeout_s=20))
    try:
        assert isinstance(f, Fleet) and f.attempt_timeout_s == 20
    finally:
        f.close()
    with pytest.raises(ConfigError, match="attempt_timeout_s"):
        load(ModelConfig, None, ["attempt_timeout_s=-1"])
