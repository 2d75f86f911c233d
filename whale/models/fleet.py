"""Several OpenAI-compatible endpoints that serve the same weights, as one `ChatModel`.

Routing: each call goes to the endpoint that is up and has the fewest calls in flight (ties:
round robin), under `max_concurrency` calls per endpoint (0: unbounded). A call that finds
every endpoint full waits for a slot; the wait counts against the call's timeout.

Health: a call that fails for the server's reason (unreachable, dropped connection, 5xx, 429,
a reply without choices or not a chat completion, a 404 for the model: the endpoint does not
serve it) marks its endpoint down and is tried again at once on another one;
such failovers are not the endpoint's own retries (`retries`, kept low so that failover is
fast). A down endpoint is probed in the background (`GET {base}/models` every `probe_s`) and
is put back when it answers 200. A call whose error is the caller's (ContextOverflow,
other 4xx) or whose time is spent (ModelTimeout) is not tried elsewhere. With
every endpoint down, a call waits up to its timeout for one to come back, then fails with
ModelUnreachable naming each endpoint and its last error.

Hung endpoints (they accept calls and never answer): a call that times out on an endpoint
has the endpoint probed at once, in the background; when the probe gets no 200 either, the
endpoint is marked down (and probed back as above), so later calls go elsewhere. A merely
slow server answers the probe and stays up. With `attempt_timeout_s` (0: off), an attempt
that gets no reply within that many seconds of the fleet's own bound is a server fault: the
endpoint is marked down at once and the call is tried on another endpoint with the time it
has left (a slow but live server is put back by the next probe). A caller's shorter timeout
never marks an endpoint down by itself: only the probe does.

`name` is `fleet:{model}`: the response cache and records see one model however many
endpoints serve it, so EVERY ENDPOINT OF A FLEET MUST SERVE THE SAME WEIGHTS under the same
model name; nothing checks that. Which endpoint answered is in `served_by` (per thread, the
latest call) and in `stats()`.

Not covered: a server whose HTTP side answers the probe while its generation is stuck stays
up (it looks slow, not hung; `attempt_timeout_s` still fails its calls over); the calls in
flight on a hung endpoint when it is marked down each wait out their own time (or attempt
time); the probe does not check that the endpoint lists the model; one API key (from
`api_key`) is sent to every endpoint; no weights per endpoint (a faster server gets more
calls only by finishing sooner).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from whale.models.base import (
    Completion,
    ContextOverflow,
    Message,
    ModelError,
    ModelNotFound,
    ModelTimeout,
    ModelUnreachable,
    Sampling,
)
from whale.models.openai_compat import OpenAICompatible, StatusError

MAX_ENDPOINTS = 256
MAX_URL_CHARS = 2000
_POLL_S = 0.05  # how often waits look at close()/refuse(), which cannot notify (no lock)


def check_endpoints(endpoints: Sequence[str]) -> list[str]:
    """The base URLs without a trailing slash; ValueError for a URL that is not http(s)://HOST,
    a duplicate (after normalizing) or more than MAX_ENDPOINTS of them."""
    if len(endpoints) > MAX_ENDPOINTS:
        raise ValueError(f"endpoints: at most {MAX_ENDPOINTS} (got {len(endpoints)})")
    seen: list[str] = []
    for url in endpoints:
        if not isinstance(url, str) or len(url) > MAX_URL_CHARS:
            raise ValueError(f"endpoints: {str(url)[:60]!r} is not a URL of at most "
                             f"{MAX_URL_CHARS} characters")  # fmt: skip
        base = url.strip().rstrip("/")
        try:
            parts = urlsplit(base)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as e:
            raise ValueError(f"endpoints: {url[:60]!r} is not a URL ({e})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoints: {url[:60]!r} is not an http:// or https:// URL")
        if base in seen:
            raise ValueError(f"endpoints: {base[:60]!r} is listed twice")
        seen.append(base)
    return seen


class _Endpoint(OpenAICompatible):
    """An OpenAICompatible that remembers, per thread, the HTTP status of its latest failed
    attempt, so that the fleet tells a server's 5xx from a caller's 4xx without reading
    messages."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seen = threading.local()

    def _once(self, messages: list[Message], sampling: Sampling, timeout: float) -> Completion:
        try:
            return super()._once(messages, sampling, timeout)
        except StatusError as e:
            self._seen.status = e.status_code
            raise

    def take_status(self) -> int | None:
        status: int | None = getattr(self._seen, "status", None)
        self._seen.status = None
        return status

    def probe(self, timeout: float) -> str | None:
        """None when `GET {base}/models` answers 200, else what went wrong."""
        try:
            self._get("models", timeout)
        except StatusError as e:
            return f"probe answered {e.status_code}"
        except Exception as e:  # connection errors; a client closed under the probe
            return f"probe failed: {e.__cause__ or e}"
        return None


@dataclass
class _State:
    client: _Endpoint
    url: str
    calls: int = 0  # attempts routed here
    served: int = 0  # attempts that returned a completion
    failures: int = 0  # server faults (each marked the endpoint down)
    errors: int = 0  # caller faults and timeouts, passed to the caller
    in_flight: int = 0
    up: bool = True
    last_error: str = ""  # of the latest call that failed here
    probe_error: str = ""  # of the latest probe that failed
    checking: bool = False  # a probe after a timed-out call is running


class Fleet:
    def __init__(
        self,
        model: str,
        endpoints: Sequence[str],
        *,
        api_key: str | None = None,
        max_concurrency: int = 0,
        retries: int = 1,
        backoff_s: float = 0.2,
        timeout_s: float = 120.0,
        probe_s: float = 5.0,
        max_attempts: int | None = None,
        token_ids: bool = False,
        attempt_timeout_s: float = 0.0,
    ) -> None:
        """`retries`/`backoff_s`: each endpoint's own retries of one call (keep 0-1: the other
        endpoints are the retry). `max_attempts` (default 3 per endpoint): failovers of one
        call in all, so that endpoints that fail, pass the probe and fail again cannot loop a
        call until its timeout. `attempt_timeout_s`: see the module (0: off)."""
        urls = check_endpoints(endpoints)
        if not urls:
            raise ValueError("a fleet needs at least one endpoint")
        if max_concurrency < 0 or retries < 0 or not probe_s > 0 or not timeout_s > 0:
            raise ValueError("max_concurrency, retries >= 0 and probe_s, timeout_s > 0 needed")
        if not attempt_timeout_s >= 0:
            raise ValueError("attempt_timeout_s >= 0 needed (0: off)")
        self.model = model
        self.name = f"fleet:{model}"
        self.api_key, self.token_ids = api_key, token_ids  # what a copy elsewhere needs
        self.max_concurrency, self.timeout_s, self.probe_s = max_concurrency, timeout_s, probe_s
        self.attempt_timeout_s = attempt_timeout_s
        self.max_attempts = max_attempts if max_attempts is not None else 3 * len(urls)
        self._eps = [
            _State(_Endpoint(model, u, api_key=api_key, retries=retries, backoff_s=backoff_s,
                             timeout_s=timeout_s, token_ids=token_ids), u)
            for u in urls
        ]  # fmt: skip
        self._cond = threading.Condition()
        self._next = 0  # round-robin start among ties
        self._prober: threading.Thread | None = None
        self._local = threading.local()
        self._closed = False  # a plain flag: set from signal handlers, so no lock

    def urls(self) -> list[str]:
        """The endpoints' base URLs, in the order given."""
        return [e.url for e in self._eps]

    @property
    def served_by(self) -> str | None:
        """The endpoint that answered this thread's latest successful call."""
        return getattr(self._local, "served_by", None)

    def chat(
        self, messages: list[Message], sampling: Sampling, timeout: float | None = None
    ) -> Completion:
        timeout = self.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        for _ in range(self.max_attempts):
            ep = self._acquire(deadline, timeout)
            left = deadline - time.monotonic()
            # The fleet's own bound on one attempt, when it is tighter than the call's.
            bounded = 0 < self.attempt_timeout_s < left
            try:
                if left <= 0:
                    raise ModelTimeout(f"{self.name}: no reply within {timeout:.1f} s")
                ep.client.take_status()
                c = ep.client.chat(messages, sampling, self.attempt_timeout_s if bounded else left)
            except ModelError as e:
                hung = bounded and isinstance(e, ModelTimeout)
                server_fault = hung or self._server_fault(ep, e)
                why = (f"no reply within attempt_timeout_s = {self.attempt_timeout_s:g} s "
                       "(hung?)" if hung else str(e))  # fmt: skip
                self._release(ep, "down" if server_fault else "error", why)
                if isinstance(e, ModelTimeout) and not server_fault:
                    self._check_after_timeout(ep)  # hung, or slow? the probe tells
                if self._closed:
                    raise ModelError(f"{self.name}: fleet closed") from None
                if not server_fault:
                    raise
                continue
            except BaseException:
                self._release(ep, "error", "interrupted")
                raise
            self._release(ep, "ok")
            self._local.served_by = ep.url
            return c
        raise ModelUnreachable(
            f"{self.name}: no endpoint answered in {self.max_attempts} attempts: {self._errors()}"
        )

    def _server_fault(self, ep: _State, e: ModelError) -> bool:
        status = ep.client.take_status()
        if isinstance(e, ModelNotFound):
            return True  # this endpoint does not serve the fleet's model: take it out
        if isinstance(e, ContextOverflow | ModelTimeout):
            return False
        if isinstance(e, ModelUnreachable) or status is None:
            return True  # connection refused or dropped, or a reply without choices
        return status >= 500 or status in (408, 429)

    def _acquire(self, deadline: float, timeout: float) -> _State:
        """A slot on the least busy endpoint that is up; waits (polling close()) until the
        deadline for one to come back or to have room."""
        with self._cond:
            while True:
                if self._closed:
                    raise ModelError(f"{self.name}: fleet closed")
                up = [e for e in self._eps if e.up]
                room = [e for e in up if not self.max_concurrency
                        or e.in_flight < self.max_concurrency]  # fmt: skip
                if room:
                    least = min(e.in_flight for e in room)
                    n = len(self._eps)
                    order = [self._eps[(self._next + i) % n] for i in range(n)]
                    ep = next(e for e in order if e in room and e.in_flight == least)
                    self._next = (self._eps.index(ep) + 1) % n
                    ep.in_flight += 1
                    ep.calls += 1
                    return ep
                left = deadline - time.monotonic()
                if left <= 0:
                    if not up:
                        raise ModelUnreachable(f"{self.name}: every endpoint is down (waited "
                                               f"{timeout:.1f} s): {self._errors()}")  # fmt: skip
                    raise ModelTimeout(
                        f"{self.name}: every endpoint stayed busy ({self.max_concurrency} "
                        f"calls each) for {timeout:.1f} s"
                    )
                self._cond.wait(min(left, _POLL_S))

    def _release(self, ep: _State, outcome: str, error: str = "") -> None:
        with self._cond:
            ep.in_flight -= 1
            if outcome == "ok":
                ep.served += 1
            elif outcome == "down":
                self._mark_down(ep, error)
            else:
                ep.errors += 1
            self._cond.notify_all()

    def _mark_down(self, ep: _State, error: str) -> None:
        """Take `ep` out and start the prober (holding self._cond)."""
        ep.failures += 1
        ep.last_error = error[:300]
        ep.up = False
        if self._prober is None and not self._closed:
            self._prober = threading.Thread(target=self._probe_loop, daemon=True,
                                            name=f"{self.name} probe")  # fmt: skip
            self._prober.start()

    def _check_after_timeout(self, ep: _State) -> None:
        """Probe `ep` now, in the background, after a call timed out on it: no 200 from the
        probe either and it is marked down (a hung server), else it stays up (a slow one).
        One such probe per endpoint at a time."""
        with self._cond:
            if ep.checking or not ep.up or self._closed:
                return
            ep.checking = True

        def check() -> None:
            problem = ep.client.probe(timeout=min(self.probe_s, 10.0))
            with self._cond:
                ep.checking = False
                if problem is not None and ep.up and not self._closed:
                    ep.probe_error = problem[:300]
                    self._mark_down(ep, f"a call timed out here and {problem}")
                    self._cond.notify_all()

        threading.Thread(target=check, daemon=True, name=f"{self.name} check").start()

    def _probe_loop(self) -> None:
        """Every probe_s, probe each down endpoint; ends when none is down or on close."""
        while True:
            end = time.monotonic() + self.probe_s
            while not self._closed and time.monotonic() < end:
                time.sleep(min(_POLL_S, max(0.0, end - time.monotonic())))
            with self._cond:
                down = [e for e in self._eps if not e.up]
                if self._closed or not down:
                    self._prober = None
                    return
            for ep in down:
                if self._closed:
                    break
                problem = ep.client.probe(timeout=min(self.probe_s, 10.0))
                with self._cond:
                    ep.probe_error = (problem or "")[:300]
                    if problem is None:
                        ep.up = True
                        self._cond.notify_all()

    def _errors(self) -> str:
        def one(e: _State) -> str:
            probe = f"; then {e.probe_error}" if e.probe_error and not e.up else ""
            return f"{e.url} ({'up' if e.up else 'down'}: {e.last_error or 'no error'}{probe})"

        return "; ".join(one(e) for e in self._eps)

    def stats(self) -> list[dict[str, Any]]:
        """Per endpoint, in the configured order: url, up, in_flight, calls, served,
        failures (server faults), errors (passed to the caller), last_error, probe_error."""
        with self._cond:
            return [
                {"url": e.url, "up": e.up, "in_flight": e.in_flight, "calls": e.calls,
                 "served": e.served, "failures": e.failures, "errors": e.errors,
                 "last_error": e.last_error, "probe_error": e.probe_error}
                for e in self._eps
            ]  # fmt: skip

    def refuse(self) -> None:
        """Fail every later call, wait and failover; unlike `close`, takes no lock
        (signal-safe)."""
        self._closed = True
        for e in self._eps:
            e.client.refuse()

    def close(self) -> None:
        self.refuse()
        for e in self._eps:
            e.client.close()
        prober = self._prober
        if prober is not None:
            prober.join(timeout=2.0)
