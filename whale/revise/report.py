"""The execution report: what the proposer sees of a harness's behaviour on Q_fb.

Right and wrong answers, with trace excerpts of the failures (model messages, tool calls and
results, errors, status, the grader's word), cut to a character budget so that a long trace
can never blow up the proposer's context (dspy#9059 sent 568K tokens). The expected answer
appears only when `show_expected` is on; it is meant for feedback questions only, never for
eval questions, which never reach a report. With the default shared dev pool the feedback
questions ARE the scoring questions: `answer_echo_screen` (on by default) makes Select refuse a
candidate that hard-codes their answers or text (see revise/screens.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from whale.evaluation import Outcome
from whale.harness import Trajectory
from whale.tasks import Question, Task


@dataclass(frozen=True)
class ReportConfig:
    char_budget: int = 6000
    show_expected: bool = True
    max_failures: int = 6
    max_correct: int = 6
    # Select's answer-echo screen (revise/screens.py): with `show_expected` on and the default
    # shared dev pool, the report shows the answers of the very questions that score
    # candidates, so a candidate that hard-codes dev answers or questions is made invalid
    # before it is scored. Off only to study what a proposer does without it.
    answer_echo_screen: bool = True


def clip(text: str, n: int) -> str:
    """Keep the head and tail of `text` within n characters, saying how much was cut."""
    text = str(text)
    if len(text) <= n:
        return text
    if n < 40:
        return text[: max(0, n)]
    keep = n - 30
    head, tail = text[: keep * 2 // 3], text[-(keep - keep * 2 // 3) :]
    return f"{head}…[{len(text) - len(head) - len(tail)} chars cut]…{tail}"


def build_report(
    task: Task,
    questions: Sequence[Question],
    outcomes: Sequence[Outcome],
    trajectories: Sequence[Trajectory],
    cfg: ReportConfig = ReportConfig(),
) -> str:
    n = len(outcomes)
    right = [i for i, o in enumerate(outcomes) if o.correct]
    wrong = [i for i, o in enumerate(outcomes) if not o.correct]
    status = Counter(o.status for o in outcomes)
    mean = sum(o.score for o in outcomes) / n if n else 0.0
    header = (
        f"Execution report on {n} feedback questions: {len(right)} correct, {len(wrong)} wrong, "
        f"mean score {mean:.2f}. Run status: "
        + ", ".join(f"{k} {v}" for k, v in sorted(status.items()))
        + ".\n"
    )
    lines_right = ["", "Correct answers:"] + [
        f"- Q{i + 1}: answered {clip(outcomes[i].answer or '', 80)!r}"
        for i in right[: cfg.max_correct]
    ]
    tail = "\n".join(lines_right) + "\n" if right else ""
    shown = wrong[: cfg.max_failures]
    room = cfg.char_budget - len(header) - len(tail) - 40
    per = max(200, room // max(1, len(shown)))
    parts = [header]
    if shown:
        parts.append(f"\nFailures ({len(wrong)}; {len(shown)} shown):\n")
    for i in shown:
        exp = task.expected(questions[i]) if cfg.show_expected else None
        parts.append(_failure(i, questions[i], outcomes[i], trajectories[i], exp, per))
    parts.append(tail)
    return clip("".join(parts), cfg.char_budget)


def _failure(i: int, q: Question, o: Outcome, t: Trajectory, expected: str | None, n: int) -> str:
    head = [f"### Q{i + 1} (status {o.status}, score {o.score:.2f})"]
    head.append(f"Question: {clip(q.prompt, n // 3)}")
    head.append(f"Harness answer: {clip(repr(o.answer), 200)}")
    if expected is not None:
        head.append(f"Expected answer: {clip(expected, 200)}")
    if o.feedback:
        head.append(f"Grader: {clip(o.feedback, 200)}")
    if o.error:
        head.append(f"Error: {clip(o.error, 400)}")
    trace = _trace(t, max(100, n - sum(len(h) for h in head)))
    return clip("\n".join(head + trace), n) + "\n\n"


def _trace(t: Trajectory, n: int) -> list[str]:
    events = [e for e in t.events if e["kind"] in ("model", "tool", "refused")]
    if not events:
        return ["Trace: the harness made no model or tool call."]
    per = max(60, n // (len(events) + 1))
    out = ["Trace:"]
    for k, e in enumerate(events, 1):
        out.append(_event(k, e, per))
    if t.stderr_tail.strip():
        out.append(f"  stderr: {clip(t.stderr_tail.strip(), per)}")
    return out


def _event(k: int, e: dict[str, Any], n: int) -> str:
    if e["kind"] == "model":
        last = e["messages"][-1].get("content") if e["messages"] else ""
        last = last if isinstance(last, str) else str(last or "")
        reply = e["text"] if not e.get("error") else f"<error: {e['error']}>"
        # Tool calls the model made (env.llm(..., tools=)): name and arguments as it wrote them.
        made_calls = e.get("tool_calls") or []
        calls = "; ".join(f"{c.get('name')}({c.get('arguments')})" for c in made_calls)
        made = f" + tool calls {clip(calls, n // 3)!r}" if calls else ""
        return (
            f"  [{k}] model call (finish {e['finish_reason']}): last message {clip(last, n // 2)!r}"
            f" -> reply {clip(reply, n // 2)!r}{made}"
        )
    if e["kind"] == "tool":
        res = e["result"]
        if e["name"] == "python" and isinstance(res, dict):
            shown = res.get("stdout", "") + (f" error: {res['error']}" if res.get("error") else "")
        else:
            shown = str(res)
        if e.get("error"):  # a user tool's failure (whale.harness.tools): what the harness read
            shown = f"<error: {e['error']}>"
        args = e["args"].get("code", e["args"])
        return f"  [{k}] tool {e['name']}({clip(str(args), n // 2)!r}) -> {clip(shown, n // 2)!r}"
    return f"  [{k}] refused {e['op']}: {e['reason']}"
