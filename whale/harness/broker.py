"""The broker: runs one harness on one question in a jailed worker and records the trajectory.

`run_harness(host, ...)` serves one run for the Runtime that asks (whale.harness.runtime; the
broker sees it only as a `RunHost`: its settings, its cancel switch, a fresh worker). Every
`env.llm` / `env.tools.*` call arrives over a pipe; the broker checks the budget, makes the
call (model backend, nested python sandbox, retriever, the user's tools through
whale.harness.tools.gate), appends the event to the trajectory and replies. A run ends with
one of the statuses of `trajectory.STATUSES` (and, where its error names a boundary, a
`trajectory.Failure`); a bad harness is data, never an exception out of `run_harness`.

Before a worker starts, the source is checked against the `run` contract (contract.py; a
fault is status `error`, failure LOAD, "load: ..."). The parent never blocks on the harness:
replies are written to a non-blocking pipe by the run's deadline (a harness that stops
reading is `killed`), error replies are cut to ERROR_CHARS, and requests with JSON the broker
refuses (streams.scrub: too deep, numbers out of range or not finite) get an error reply
while the run goes on. The host's cancel switch ends every run as `killed`, "cancelled".

An `llm` request out of range (calls.check_llm_args: sampling values, unknown arguments;
calls.check_prompt_size: messages too long for the model's context) is refused before any
backend call: an error reply, and a `refused` event on the trajectory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import marshal
import os
import secrets
import selectors
import struct
import time
from collections.abc import Callable
from typing import Any, Protocol

from whale.harness.budget import Budget, Limits, PythonToolLimits
from whale.harness.calls import (
    BadCall,
    Ending,
    ModelFailed,
    Refused,
    Rejected,
    check_llm_args,
    check_prompt_size,
    done_outcome,
    llm_result,
    record_params,
    record_tools,
    reply_calls,
)
from whale.harness.contract import run_contract_fault
from whale.harness.sandbox import Jailed, Sandbox
from whale.harness.streams import (
    BadRequest,
    MalformedMessage,
    PipeStalled,
    Tail,
    Woken,
    drain_rest,
    parse,
    plain,
    write_frame,
)
from whale.harness.tools.gate import ToolBackend, ToolGate
from whale.harness.trajectory import Failure, ModelCall, Status, ToolCall, Trajectory
from whale.harness.workers import Worker
from whale.models.base import ChatModel, ModelError, ModelTimeout, Sampling

# A frame on the run's pipes, both ways: a 4-byte big-endian length, then the payload
# (worker.py writes and reads it with int.to_bytes / int.from_bytes).
HEADER = struct.Struct(">I")

# The longest error text a reply carries: an error may quote what the harness sent.
ERROR_CHARS = 1000
# Out-of-range requests recorded per run: they cost no budget, so a harness may repeat one
# until its deadline; past this many the trajectory keeps only their count.
MAX_REJECTED_EVENTS = 32


class Retriever(Protocol):
    def retrieve(self, query: str, k: int) -> list[dict[str, Any]]: ...


def harness_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


class _Stop(Exception):
    def __init__(self, status: Status, error: str, failure: Failure | None = None) -> None:
        super().__init__(error)
        self.ending = Ending(status, error, None, failure)


class RunHost(Protocol):
    """What one run asks of the Runtime that started it (whale.harness.runtime.Runtime): its
    settings, its cancel switch and a fresh worker. The broker sits below the Runtime and
    never imports it."""

    @property
    def model(self) -> ChatModel | None: ...
    @property
    def budget(self) -> Budget: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def python_limits(self) -> PythonToolLimits: ...
    @property
    def sandbox(self) -> Sandbox: ...
    @property
    def temperature(self) -> float: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def cancelled(self) -> bool: ...

    def wake_fd(self) -> int:
        """Readable once the host was cancelled: every wait of a run watches it."""
        ...

    def prompt_char_limit(self) -> int | None: ...

    def run_python(self, code: str, timeout: float | None) -> dict[str, Any]: ...

    def tool_backend(self) -> ToolBackend | None:
        """What serves the user's tools (None: the run has none); see whale.harness.tools."""
        ...

    def _take_worker(self) -> Worker:
        """A started worker that has run nothing yet (the run discards it when it ends)."""
        ...


def run_harness(host: RunHost, source: str, question: str, question_id: str = "q",
                retriever: Retriever | None = None) -> Trajectory:  # fmt: skip
    """Run `source` on `question` in a fresh worker of `host`; never raises for the harness."""
    return _Run(host, source, question, question_id, retriever).execute()


class _Run:
    def __init__(
        self,
        rt: RunHost,
        source: str,
        question: str,
        question_id: str,
        retriever: Retriever | None,
    ) -> None:
        self.rt, self.source, self.question, self.retriever = rt, source, question, retriever
        self.traj = Trajectory(question_id=question_id, harness_hash=harness_hash(source))
        self.used = {"model_calls": 0, "retrievals": 0, "tool_calls": 0, "tokens": 0}
        self.refused = False
        self.rejected = 0  # out-of-range requests (calls.Rejected) so far
        self.deadline = 0.0
        self.wake = rt.wake_fd()
        self.gate = ToolGate(None, self.traj)  # the user's tools, once the run starts

    # -- budget view -------------------------------------------------------------------------
    def left(self) -> dict[str, Any]:
        b = self.rt.budget
        return {
            "model_calls": b.model_calls - self.used["model_calls"],
            "retrievals": b.retrievals - self.used["retrievals"],
            "tool_calls": b.tool_calls - self.used["tool_calls"],
            "tokens": None
            if b.max_total_tokens is None
            else b.max_total_tokens - self.used["tokens"],
            "seconds": round(max(0.0, self.deadline - time.monotonic()), 3),
            "max_tokens_per_call": b.max_tokens_per_call,
            **self.gate.left(),
        }

    # -- lifecycle ---------------------------------------------------------------------------
    def execute(self) -> Trajectory:
        t0 = time.monotonic()
        self.traj.started_at = time.time()
        self.deadline = t0 + self.rt.budget.run_timeout_s
        w: Worker | None = None
        try:
            if self.rt.cancelled:
                raise _Stop("killed", "cancelled")
            self.traj.sandbox = self.rt.sandbox.resolved()
            fault = run_contract_fault(self.source)
            if fault is not None:
                raise _Stop("error", f"load: harness {fault}", Failure.LOAD)
            self.gate = ToolGate(self.rt.tool_backend(), self.traj)  # may start the tools process
            w = self.rt._take_worker()
            tools = ["python"] + (["retrieve"] if self.retriever is not None else [])
            init = {
                "source": self.source,
                "question": self.question,
                "tools": tools + self.gate.names(),
                "tool_params": self.gate.params(),
                "endpoint": self._endpoint(),
            }
            self._send(w.tx, {**init, "budget": self.left()})
            end = self._serve(w.jailed, w.rx, w.tx)
        except _Stop as stop:
            end = stop.ending
        except Exception as e:  # noqa: BLE001 - the sandbox itself failed to start
            end = Ending("crashed", f"runtime: {type(e).__name__}: {e}", None, Failure.RUNTIME)
        finally:
            if w is not None:
                w.discard()
        if self.refused and end.status in ("ok", "error"):
            end = Ending("budget_exceeded",
                         end.error or "harness: a budget was exceeded (see refused events)",
                         end.answer, end.failure or Failure.HARNESS)  # fmt: skip
        t = self.traj
        t.status, t.error, t.answer, t.failure = end.status, end.error, end.answer, end.failure
        self.traj.wall_s = time.monotonic() - t0
        return self.traj

    def _endpoint(self) -> dict[str, Any] | None:
        """What the worker needs to serve the run's OpenAI-compatible endpoint (endpoint.py):
        a fresh key, the model's name, and the largest request body, kept so that its `llm`
        frame (JSON with every non-ASCII character escaped as 6 bytes) stays under the
        frame limit. None without a model."""
        model = self.rt.model
        if model is None:
            return None
        return {"key": "whale-" + secrets.token_urlsafe(18), "model": str(model.name),
                "body_bytes": self.rt.limits.message_bytes // 6}  # fmt: skip

    def _serve(self, jailed: Jailed, rx: int, tx: int) -> Ending:
        proc = jailed.proc
        assert proc.stdout is not None and proc.stderr is not None
        tails = {"out": Tail(), "err": Tail()}
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "out")
        sel.register(proc.stderr.fileno(), selectors.EVENT_READ, "err")
        sel.register(rx, selectors.EVENT_READ, "rpc")
        sel.register(self.wake, selectors.EVENT_READ, "wake")
        buf = bytearray()
        limit = self.rt.limits
        try:
            while True:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise _Stop("timeout", f"run exceeded {self.rt.budget.run_timeout_s:g} s")
                events = sel.select(left)
                for key, _ in events:
                    if key.data == "wake":
                        raise _Stop("killed", "cancelled")
                    data = os.read(key.fd, 1 << 16)
                    if key.data != "rpc":
                        if not data:
                            sel.unregister(key.fd)
                        tails[key.data].add(data)
                        if tails["out"].total + tails["err"].total > limit.output_bytes:
                            raise _Stop(
                                "killed",
                                f"output limit: printed more than {limit.output_bytes} bytes",
                            )
                        continue
                    if not data:
                        return self._exited(jailed)
                    buf += data
                    while len(buf) >= HEADER.size:
                        (size,) = HEADER.unpack_from(buf)
                        if size > limit.message_bytes:
                            raise _Stop(
                                "killed", f"broker message of {size} bytes is over the limit"
                            )
                        if len(buf) < HEADER.size + size:
                            break
                        frame = bytes(buf[HEADER.size : HEADER.size + size])
                        del buf[: HEADER.size + size]
                        try:
                            msg = parse(frame)
                        except MalformedMessage as e:
                            raise _Stop("killed", f"malformed broker message: {e}") from None
                        except BadRequest as e:
                            self._send(tx, {"ok": False, "error": str(e), "budget": self.left()})
                            continue
                        if msg.get("op") == "done":
                            return done_outcome(msg, self.rt.limits.answer_chars)
                        reply = plain(self._handle(msg))
                        if self.rt.cancelled:  # it was in a model call when cancel() came
                            raise _Stop("killed", "cancelled")
                        self._send(tx, reply)
        finally:
            sel.close()
            jailed.kill()
            drain_rest(proc, tails)
            self.traj.stdout_tail, self.traj.stderr_tail = tails["out"].text(), tails["err"].text()

    def _send(self, tx: int, obj: Any) -> None:
        """One reply to the worker, written by the run's deadline (the harness may have
        stopped reading: a stalled pipe kills the run) or until cancel()."""
        data = marshal.dumps(obj)
        try:
            write_frame(tx, HEADER.pack(len(data)) + data, self.deadline, self.wake)
        except PipeStalled:
            raise _Stop(
                "killed",
                "broker reply stalled: the harness stopped reading its pipe "
                f"until the run's {self.rt.budget.run_timeout_s:g} s ran out",
            ) from None
        except Woken:
            raise _Stop("killed", "cancelled") from None
        except BrokenPipeError:
            raise _Stop("crashed", "worker exited without an answer (it closed its pipe)") from None

    def _exited(self, jailed: Jailed) -> Ending:
        try:
            rc = jailed.proc.wait(timeout=2)
        except Exception:  # noqa: BLE001
            rc = None
        raise _Stop("crashed", f"worker exited without an answer (exit status {rc})")

    # -- requests ----------------------------------------------------------------------------
    def _handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op, args = msg.get("op"), msg.get("args")
        handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
            "llm": self._llm,
            "python": self._python,
            "retrieve": self._retrieve,
            "tool": self._tool,
        }
        if op not in handlers or not isinstance(args, dict):
            # Quote only the start of what the harness sent: the reply must stay small.
            shown = repr(op)[:80] + ("..." if len(repr(op)) > 80 else "")
            return {"ok": False, "error": f"unknown request {shown}", "budget": self.left()}
        try:
            result = handlers[op](args)
        except Refused as r:
            self.refused = True
            self.traj.add_refusal(str(op), str(r)[:ERROR_CHARS])
            return {
                "ok": False,
                "budget_exceeded": True,
                "error": str(r)[:ERROR_CHARS],
                "budget": self.left(),
            }
        except Rejected as e:
            self._record_rejected(str(op), str(e)[:ERROR_CHARS])
            return {"ok": False, "error": str(e)[:ERROR_CHARS], "budget": self.left(),
                    "kind": "invalid"}  # fmt: skip
        except BadCall as e:
            return {"ok": False, "error": str(e)[:ERROR_CHARS], "budget": self.left(),
                    "kind": getattr(e, "kind", "invalid")}  # fmt: skip
        return {"ok": True, "result": result, "budget": self.left()}

    def _record_rejected(self, op: str, reason: str) -> None:
        """A `refused` event for an out-of-range request (the run's status is left alone: the
        harness was told and may go on), up to MAX_REJECTED_EVENTS per run."""
        self.rejected += 1
        if self.rejected < MAX_REJECTED_EVENTS:
            self.traj.add_refusal(op, reason)
        elif self.rejected == MAX_REJECTED_EVENTS:
            self.traj.add_refusal(op, f"{reason} (later out-of-range requests of this run are "
                                      "refused the same way but not recorded)")  # fmt: skip

    def _spend(self, what: str, cap: int) -> None:
        if self.used[what] >= cap:
            raise Refused(f"budget exceeded: {what} limit of {cap} reached")
        self.used[what] += 1

    def _remaining_s(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Stop("timeout", f"run exceeded {self.rt.budget.run_timeout_s:g} s")
        return left

    def _llm(self, args: dict[str, Any]) -> dict[str, Any]:
        b = self.rt.budget
        messages, sampling = check_llm_args(args, b, self.rt.temperature, self.rt.seed)
        if self.rt.model is None:
            raise BadCall("no model backend is configured for this run")
        # Before the budget: a prompt that cannot fit is never sent, so it costs no call.
        check_prompt_size(messages, self.rt.prompt_char_limit(), sampling.tools)
        if b.max_total_tokens is not None:
            tokens_left = b.max_total_tokens - self.used["tokens"]
            if tokens_left <= 0:
                raise Refused(f"budget exceeded: token limit of {b.max_total_tokens} reached")
            sampling = dataclasses.replace(
                sampling, max_tokens=min(sampling.max_tokens, tokens_left)
            )
        self._spend("model_calls", b.model_calls)
        timeout = min(b.model_call_timeout_s, self._remaining_s())
        t = time.monotonic()
        try:
            c = self.rt.model.chat(messages, sampling, timeout=timeout)
        except ModelTimeout as e:
            self._record_failed_call(messages, sampling, t, e)
            self._remaining_s()  # the run's own clock ran out: status timeout
            raise ModelFailed(f"model call timed out after {timeout:.1f} s", "timeout") from None
        except ModelError as e:
            self._record_failed_call(messages, sampling, t, e)
            raise ModelFailed(f"model error: {e}") from None
        self.used["tokens"] += c.charged_tokens(sampling.max_tokens)
        calls = reply_calls(c, self.used["model_calls"] - 1)
        self.traj.add_model_call(
            ModelCall(
                messages=messages,
                text=c.text,
                finish_reason=c.finish_reason,
                usage=dict(c.usage),
                latency_s=time.monotonic() - t,
                token_ids=c.token_ids,
                prompt_token_ids=c.prompt_token_ids,
                params=record_params(sampling),
                cached=c.cached,
                tools=record_tools(sampling),
                tool_calls=calls or None,
                raw_text=c.raw_text,
            )
        )
        return llm_result(c, calls)

    def _record_failed_call(
        self, messages: list[dict[str, Any]], sampling: Sampling, t: float, e: Exception
    ) -> None:
        self.traj.add_model_call(
            ModelCall(
                messages=messages,
                text="",
                finish_reason="error",
                latency_s=time.monotonic() - t,
                params=record_params(sampling),
                error=f"{type(e).__name__}: {e}",
                tools=record_tools(sampling),
            )
        )

    def _python(self, args: dict[str, Any]) -> dict[str, Any]:
        code, timeout = args.get("code"), args.get("timeout")
        if not isinstance(code, str):
            raise BadCall("python(code): code must be a string")
        if "\0" in code:
            raise BadCall("python(code): code holds a NUL byte, which Python source cannot")
        if timeout is not None and not isinstance(timeout, int | float):
            raise BadCall("python(timeout=): timeout must be a number of seconds")
        self._spend("tool_calls", self.rt.budget.tool_calls)
        t = time.monotonic()
        wanted = self.rt.python_limits.timeout_s if timeout is None else float(timeout)
        result = self.rt.run_python(code, min(wanted, self._remaining_s()))
        if self.rt.cancelled:
            raise _Stop("killed", "cancelled")
        self.traj.add_tool_call(
            ToolCall("python", {"code": code, "timeout": timeout}, result, time.monotonic() - t)
        )
        return result

    def _tool(self, args: dict[str, Any]) -> Any:
        """A user or MCP tool (whale.harness.tools.gate: checks, budget, record)."""
        result = self.gate.call(args, self._remaining_s)
        if self.rt.cancelled:
            raise _Stop("killed", "cancelled")
        return result

    def _retrieve(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        query, k = args.get("query"), args.get("k", 5)
        if self.retriever is None:
            raise BadCall("this task provides no retriever")
        if not isinstance(query, str) or not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise BadCall("retrieve(query, k): query must be a string and k a positive int")
        if not query.strip():
            return []  # an empty query returns nothing and costs no budget
        self._spend("retrievals", self.rt.budget.retrievals)
        t = time.monotonic()
        passages = self.retriever.retrieve(query, min(k, 50))
        self.traj.add_tool_call(
            ToolCall("retrieve", {"query": query, "k": k}, passages, time.monotonic() - t)
        )
        return passages
