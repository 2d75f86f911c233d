"""The one trajectory record everyone reads (report builder, SFT data, archive, HTML report).

A trajectory is written by the parent process (the broker), never by the harness: the harness
can only *ask* for model and tool calls, and the parent records what it actually did. So a
hostile harness cannot forge a model completion or hide a tool call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

# 2: `failure` (the kind of a failed run, `Failure`). A version-1 record reads as version 2,
# its failure kind derived from its error text (`read_failure`).
# 3: tool calling through `env.llm`: a model event's `tools` (the schemas offered),
# `tool_calls` (the calls the model made) and `raw_text`; its messages may carry
# `tool_calls` (assistant) and `tool_call_id` (tool). Bumped so that a reader of version 2
# refuses these records rather than reading a tool-call completion as its (empty) text.
# Version 1 and 2 records read as version 3 with no tools.
TRAJECTORY_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
# Text one trajectory records across its events. Past it, each string of a new event is kept
# as its head and tail (`clipped_chars` counts what was left out): a harness within its
# message and output limits could otherwise write hundreds of MB per candidate into the
# ledger and the archive (12 model calls of 4 MB each, measured by an attack).
RECORD_CHARS = 1_000_000
CLIP_KEEP = 2000

Status = Literal["ok", "error", "timeout", "budget_exceeded", "crashed", "killed"]
STATUSES: tuple[Status, ...] = ("ok", "error", "timeout", "budget_exceeded", "crashed", "killed")


class Failure(StrEnum):
    """The boundary a failed run's error is attributed to, set where the error is made (the
    worker, the broker). Its value is the prefix of the error text ("load: ..."), kept there
    for people and for records written before this field.

    - LOAD: the harness never ran: it breaks the `run` contract, does not compile, or raised
      while its module was executed (status `error`).
    - HARNESS: its `run` raised, returned no string or an over-long one, sent a malformed
      `done`, or ran out of a budget (status `error` or `budget_exceeded`).
    - RUNTIME: whale's side failed: the jail could not be started (status `crashed`).

    None for a run that ended `ok`, and for a run the broker ended (`timeout`, `killed`: a
    limit or a cancel, `crashed`: the worker died, or a Ray worker was lost twice): its
    status says what happened and its error says why."""

    LOAD = "load"
    HARNESS = "harness"
    RUNTIME = "runtime"


def read_failure(record: dict[str, Any]) -> Failure | None:
    """The failure kind of a trajectory or ledger record: its `failure` field; for a record
    written before the field existed (no such key), the kind named by its error text's prefix
    ("load: ..."). This is the one place that reads the prefix. ValueError for a value that
    is no kind."""
    if "failure" in record:
        value = record["failure"]
        return None if value is None else Failure(value)
    error = record.get("error")
    head = error.split(":", 1)[0] if isinstance(error, str) and ":" in error else None
    return Failure(head) if head in {f.value for f in Failure} else None


@dataclass
class ModelCall:
    messages: list[dict[str, Any]]
    text: str
    finish_reason: str
    usage: dict[str, int] = field(default_factory=dict)
    latency_s: float = 0.0
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    cached: bool = False
    # The function tools the call offered (OpenAI's schemas, as sent), None for none.
    tools: list[dict[str, Any]] | None = None
    # The calls the model made, each {id, name, arguments (the JSON text it wrote)}: the ids
    # are the ones the harness got (whale's), which its `tool` messages then name.
    tool_calls: list[dict[str, str]] | None = None
    # The reply as the model wrote it where whale read its call out of the text (`text` is
    # then ""; models.base.text_call), else None.
    raw_text: str | None = None


@dataclass
class ToolCall:
    name: str
    args: dict[str, Any]
    result: Any
    latency_s: float = 0.0
    error: str | None = None


@dataclass
class Trajectory:
    question_id: str
    harness_hash: str
    status: Status = "ok"
    answer: str | None = None
    error: str | None = None
    # Events in call order; each is {"kind": "model"|"tool"|"refused", ...}.
    events: list[dict[str, Any]] = field(default_factory=list)
    stdout_tail: str = ""
    stderr_tail: str = ""
    started_at: float = 0.0
    wall_s: float = 0.0
    sandbox: str = ""
    clipped_chars: int = 0  # text of events not recorded (over RECORD_CHARS)
    version: int = TRAJECTORY_VERSION
    # Times this rollout was run again because the executor's worker running it was lost
    # (a Ray actor that died); records from before the field read as 0.
    retries: int = 0
    # Tokens of the model calls made by those lost tries (paid, though their trajectories
    # died with the worker), as the worker's broker reported them; counted by tokens().
    lost_tokens: int = 0
    # Whose fault a failed run was, where its error names one (see Failure); None otherwise.
    failure: Failure | None = None

    def __post_init__(self) -> None:
        self._recorded = sum(_text_size(e) for e in self.events)

    # -- views -----------------------------------------------------------------------------
    def model_calls(self) -> list[ModelCall]:
        return [_from_dict(ModelCall, e) for e in self.events if e["kind"] == "model"]

    def tool_calls(self) -> list[ToolCall]:
        return [_from_dict(ToolCall, e) for e in self.events if e["kind"] == "tool"]

    def tokens(self) -> int:
        return self.lost_tokens + sum(int(c.usage.get("total_tokens", 0))
                                      for c in self.model_calls())  # fmt: skip

    # -- records ---------------------------------------------------------------------------
    def add_model_call(self, call: ModelCall) -> None:
        self._add({"kind": "model", **dataclasses.asdict(call)})

    def add_tool_call(self, call: ToolCall) -> None:
        self._add({"kind": "tool", **dataclasses.asdict(call)})

    def _add(self, event: dict[str, Any]) -> None:
        size = _text_size(event)
        if self._recorded + size > RECORD_CHARS:
            event = _clip(event)
            kept = _text_size(event)
            self.clipped_chars += size - kept
            size = kept
        self._recorded += size
        self.events.append(event)

    def add_refusal(self, op: str, reason: str) -> None:
        self.events.append({"kind": "refused", "op": op, "reason": reason})

    def to_dict(self) -> dict[str, Any]:
        # Shallow: events are plain dicts already, and a deep copy (dataclasses.asdict) was a
        # cost the search paid for every trajectory it archives (docs/measurements.md).
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """A record as `to_dict` wrote it, of any version in READABLE_VERSIONS (read as the
        current one); ValueError for another version or a failure that is no kind."""
        version = d.get("version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"trajectory version {version!r} is not one of {READABLE_VERSIONS}")
        # Version 1 had no `failure`: read_failure derives it from the error text.
        failure = read_failure(d)
        return _from_dict(cls, {**d, "failure": failure, "version": TRAJECTORY_VERSION})


def _text_size(x: Any) -> int:
    if isinstance(x, str):
        return len(x)
    if isinstance(x, dict):
        return sum(_text_size(v) for v in x.values())
    if isinstance(x, list | tuple):
        return sum(_text_size(v) for v in x)
    return 0


def _clip(x: Any) -> Any:
    if isinstance(x, str):
        if len(x) <= 2 * CLIP_KEEP:
            return x
        return f"{x[:CLIP_KEEP]}…[{len(x) - 2 * CLIP_KEEP} chars not recorded]…{x[-CLIP_KEEP:]}"
    if isinstance(x, dict):
        return {k: _clip(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clip(v) for v in x]
    return x


def _from_dict(cls: Any, d: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})
