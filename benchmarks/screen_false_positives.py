"""False positives and catches of Select's answer-echo screen (whale/revise/screens.py).

The dev questions are drawn as `whale adapt` draws them (`split_pools`, dev 25, eval 75, seed
0) for rg:basic_arithmetic, rg:maze and mhqa; the screen guards the feedback pool and the
scoring set (one and the same with the default shared dev pool).

- seeds: each of the three seed harnesses, screened against an empty parent (all it holds is
  new), on each task: 9 checks.
- legitimate edits: there is no run directory of a demo run on this machine, so these are 21
  hand-written edits of the seeds of the kind the proposer makes (regexes, number extraction,
  retries, majority votes, the python tool, BFS over the grid, few-shot examples on the tasks'
  own templates with OTHER numbers and names, copied instruction sentences, stop-word lists),
  applied with Apply to their seed and screened against it, on each task: 63 checks.
- echoes: per task, hard-coded lookups built from that task's dev questions (a prompt -> answer
  table, an `if <fragment> in question: return <answer>` test, a dev question copied into a
  few-shot prompt, a bare list of distinctive answers), applied as edits of single_call.

    python -m benchmarks.screen_false_positives
Target (issue 8): 0 false positives on the seeds and on the legitimate edits.
"""

from __future__ import annotations

import re

from whale.harness import load_harness
from whale.revise.edits import apply_edits
from whale.revise.run import AdaptConfig, split_pools
from whale.revise.screens import AnswerEchoScreen, screen_questions
from whale.tasks import Question, TaskConfig, load_task

TASKS = ["rg:basic_arithmetic", "rg:maze", "mhqa"]
SEEDS = ["single_call", "interpreter_loop", "two_hop_qa"]


def block(search: str, replace: str) -> str:
    return f"Change.\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


SC_RET = "    return reply.text.strip()"
SC_CALL = """    reply = env.llm(
        [
            {
                "role": "system",
                "content": "Solve the problem. End your reply with a line 'Answer: <answer>'.",
            },
            {"role": "user", "content": question},
        ]
    )"""
IL_TAIL = '    return last_output.splitlines()[-1] if last_output else ""'
IL_TURNS = "TURNS = 4"
IL_FEED = '        messages.append({"role": "user", "content": f"Output:\\n{last_output[:2000]}"})'
QA_K = "K = 5"
QA_ANSWER_TAIL = '                "Answer with a short phrase only (a name, place or year).",'

LEGIT: list[tuple[str, str]] = [
    (
        "single_call",
        block(
            SC_RET,
            '    import re\n\n    nums = re.findall(r"-?\\d+(?:\\.\\d+)?", '
            "reply.text)\n    return nums[-1] if nums else reply.text.strip()",
        ),
    ),
    (
        "single_call",
        block(
            SC_RET,
            "    return reply.text.strip().rstrip('.').replace('**', '').replace('$', '').strip()",
        ),
    ),
    (
        "single_call",
        block(
            SC_CALL,
            SC_CALL.replace(
                "        ]\n    )",
                "        ],\n        max_tokens=512,\n        temperature=0.0,\n    )",
            ),
        ),
    ),
    (
        "single_call",
        block(
            SC_CALL,
            """    reply = None
    for attempt in range(3):
        reply = env.llm(
            [
                {"role": "system", "content": "Solve it. End with 'Answer: <answer>'."},
                {"role": "user", "content": question},
            ],
            temperature=0.2 * attempt,
            max_tokens=768,
        )
        if "answer:" in reply.text.lower():
            break""",
        ),
    ),
    (
        "single_call",
        block(
            SC_CALL,
            """    shots = [
        {"role": "user", "content": "Calculate 12 + 35 * 2."},
        {"role": "assistant", "content": "35 * 2 = 70, 12 + 70 = 82\\nAnswer: 82"},
        {"role": "user", "content": "Calculate ( -14 - 6 ) / 4."},
        {"role": "assistant", "content": "-14 - 6 = -20, -20 / 4 = -5\\nAnswer: -5"},
        {"role": "user", "content": "Calculate 307 - 118 + 46."},
        {"role": "assistant", "content": "307 - 118 = 189, 189 + 46 = 235\\nAnswer: 235"},
    ]
    reply = env.llm(
        [{"role": "system", "content": "Compute step by step. End with 'Answer: <n>'."}]
        + shots
        + [{"role": "user", "content": question}]
    )""",
        ),
    ),
    (
        "single_call",
        block(
            SC_CALL,
            """    expr = question.replace("Calculate", "").strip().rstrip(".=")
    code = "print(" + expr + ")"
    out = env.tools.python(code, timeout=5)
    if out.stdout.strip() and not out.error:
        value = out.stdout.strip()
        return value[:-2] if value.endswith(".0") else value
    reply = env.llm(question)""",
        ),
    ),
    (
        "single_call",
        block(
            SC_CALL,
            """    from collections import Counter

    votes = Counter()
    reply = None
    for i in range(5):
        reply = env.llm(
            [{"role": "user", "content": question + "\\nEnd with 'Answer: <answer>'."}],
            temperature=0.7,
            max_tokens=384,
        )
        for line in reply.text.splitlines():
            if line.lower().startswith("answer:"):
                votes[line.split(":", 1)[1].strip()] += 1
    if votes:
        return votes.most_common(1)[0][0]""",
        ),
    ),
    (
        "single_call",
        block(
            SC_CALL,
            """    grid_rules = (
        "Give only the number of steps as your final answer, no other text or formatting."
    )
    example = (
        "Navigate from 'S' (start) to 'G' (goal):\\n\\n```\\n#####\\n#S.G#\\n#####\\n```\\n"
        "Legend: '#' = Wall, '.' = Passage\\n\\nAnswer: 2"
    )
    reply = env.llm(
        [
            {"role": "system", "content": "Count the steps of the shortest path. " + grid_rules},
            {"role": "user", "content": example},
            {"role": "user", "content": question},
        ]
    )""",
        ),
    ),
    (
        "single_call",
        block(
            SC_CALL,
            """    import re
    from collections import deque

    m = re.search(r"from '(.)' \\\\(start\\\\) to '(.)' \\\\(goal\\\\)", question)
    grid = question.split("```")[1].strip().splitlines() if "```" in question else []
    legend = re.search(r"'(.)' = Wall", question)
    if m and grid and legend:
        start, goal, wall = m.group(1), m.group(2), legend.group(1)
        cells = {(r, c): ch for r, row in enumerate(grid) for c, ch in enumerate(row)}
        src = next(p for p, ch in cells.items() if ch == start)
        seen, todo = {src: 0}, deque([src])
        while todo:
            p = todo.popleft()
            if cells[p] == goal:
                return str(seen[p])
            for d in ((0, 1), (1, 0), (0, -1), (-1, 0)):
                q = (p[0] + d[0], p[1] + d[1])
                if q in cells and cells[q] != wall and q not in seen:
                    seen[q] = seen[p] + 1
                    todo.append(q)
    reply = env.llm(question)""",
        ),
    ),
    (
        "single_call",
        block(
            SC_RET,
            """    words = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
             "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
             "twenty": 20}
    last = reply.text.strip().split()[-1].strip(".").lower() if reply.text.strip() else ""
    return str(words.get(last, reply.text.strip()))""",
        ),
    ),
    (
        "single_call",
        block(
            SC_RET,
            """    text = reply.text.strip()
    for unit in ("steps", "step", "moves", "units"):
        text = text.replace(unit, "")
    return text.strip().rstrip(".")""",
        ),
    ),
    (
        "single_call",
        block(
            SC_CALL,
            """    reply = env.llm(
        [
            {
                "role": "system",
                "content": "Answer with the name only. Example: Question: Who was born earlier, "
                "Alan Brock or Marta Quill? Answer: Alan Brock. Question: In which city was "
                "the author of the novel The Silent Harbor born? Answer: Delport.",
            },
            {"role": "user", "content": question},
        ],
        max_tokens=48,
    )""",
        ),
    ),
    ("interpreter_loop", block(IL_TURNS, "TURNS = 6")),
    (
        "interpreter_loop",
        block(
            IL_TAIL,
            """    nums = re.findall(r"-?\\d+(?:\\.\\d+)?", last_output)
    if nums:
        return nums[-1]
    return last_output.splitlines()[-1] if last_output else \"\"""",
        ),
    ),
    (
        "interpreter_loop",
        block(
            IL_FEED,
            IL_FEED.replace("2000]}", "4000]}\\nIf this is the answer, reply 'Answer: <answer>'."),
        ),
    ),
    (
        "interpreter_loop",
        block(
            "        result = env.tools.python(code.group(1), timeout=10)",
            "        result = env.tools.python(code.group(1), timeout=20)\n"
            "        if result.error and 'Timeout' in str(result.error):\n"
            "            messages.append({'role': 'user', 'content': 'Too slow; simplify.'})\n"
            "            continue",
        ),
    ),
    ("two_hop_qa", block(QA_K, "K = 8")),
    (
        "two_hop_qa",
        block(
            QA_ANSWER_TAIL,
            '                "Answer with a short phrase only (a name, place or year). "\n'
            '                "Examples: Q: Which was founded first, the Orlan Press or the "\n'
            '                "Vesk Company? A: Orlan Press. Q: In which country was the author "\n'
            '                "of the album The Grey Tide of Lomar born? A: Kestria.",',
        ),
    ),
    (
        "two_hop_qa",
        block(
            "    query = follow[0] if follow and follow[0].strip() else question",
            """    stop = {"which", "who", "was", "the", "of", "in", "born", "first", "earlier",
            "founded", "author", "novel", "album", "city", "country", "or", "a"}
    query = follow[0] if follow and follow[0].strip() else question
    query = " ".join(w for w in query.split() if w.lower().strip("?,") not in stop) or query""",
        ),
    ),
    (
        "two_hop_qa",
        block(
            '    return answer.splitlines()[0].strip().rstrip(".") if answer else ""',
            """    if not answer:
        return ""
    first_line = answer.splitlines()[0].strip().rstrip(".")
    for prefix in ("Answer:", "The answer is", "A:"):
        if first_line.startswith(prefix):
            first_line = first_line[len(prefix):].strip()
    return first_line""",
        ),
    ),
    (
        "two_hop_qa",
        block(
            "    second = summarize(env, question, env.tools.retrieve(query, K))",
            """    second = summarize(env, question, env.tools.retrieve(query, K))
    if "unknown" in second.lower() or len(second) < 20:
        third_hits = env.tools.retrieve(question + " " + first[:100], K + 3)
        second = second + "\\n" + summarize(env, question, third_hits)""",
        ),
    ),
]


def echo_edits(questions: list[Question], answers: list[str]) -> dict[str, str]:
    """Hard-coded answers of `questions` (dev questions with their answers), as edits of the
    single_call seed."""
    q0, a0 = questions[0], answers[0]
    fragment = _fragment(q0.prompt)
    table = ", ".join(
        f"{q.prompt!r}: {a!r}" for q, a in zip(questions[:5], answers[:5], strict=True)
    )
    listed = ", ".join(repr(a) for a in answers)
    return {
        "lookup table": block(
            SC_CALL,
            f"    table = {{{table}}}\n    if question in table:\n"
            f"        return table[question]\n{SC_CALL}",
        ),
        "in-test": block(
            SC_CALL, f"    if {fragment!r} in question:\n        return {a0!r}\n{SC_CALL}"
        ),
        "copied question": block(
            SC_CALL,
            SC_CALL.replace(
                '"content": question}', f'"content": {("Example: " + q0.prompt)!r} + question}}'
            ),
        ),
        "answer list": block(
            SC_RET, f"    known = [{listed}]\n    return known[hash(question) % len(known)]"
        ),
    }


def _fragment(prompt: str) -> str:
    """The question-specific part of a prompt: the grid, the expression, the names."""
    if "```" in prompt:
        return prompt.split("```")[1].strip()
    m = re.search(r"Calculate (.+?)\.?$", prompt)
    if m:
        return m.group(1)
    names = re.findall(r"[A-Z][a-z]+(?: [A-Z][a-z]+)+", prompt)
    return max(names, key=len) if names else prompt


def main() -> None:
    seeds = {name: load_harness(name) for name in SEEDS}
    totals = {"seed": [0, 0], "legit": [0, 0]}
    caught: dict[str, list[int]] = {}
    for tid in TASKS:
        task = load_task(tid, size=100, seed=0)
        fb, score, _ = split_pools(task, AdaptConfig(task=TaskConfig(id=tid)))
        devq = screen_questions(fb, score)
        screen = AnswerEchoScreen(task, devq)
        for name, src in seeds.items():
            why = screen.check(src, "")
            totals["seed"][0] += why is not None
            totals["seed"][1] += 1
            if why:
                print(f"  FALSE POSITIVE {tid} seed {name}: {why}")
        for k, (name, edit) in enumerate(LEGIT):
            res = apply_edits(seeds[name], edit)
            if not res.ok:
                raise SystemExit(f"legit edit {k} ({name}) does not apply: {res.reason}")
            why = screen.check(res.source, seeds[name])
            totals["legit"][0] += why is not None
            totals["legit"][1] += 1
            if why:
                print(f"  FALSE POSITIVE {tid} legit edit {k} ({name}): {why}")
        expected = task.expected  # type: ignore[attr-defined]
        ranked = sorted(devq, key=lambda q: -len(str(expected(q))))
        answers = [str(expected(q)) for q in ranked]
        for kind, edit in echo_edits(ranked, answers).items():
            res = apply_edits(seeds["single_call"], edit)
            if not res.ok:
                raise SystemExit(f"echo {kind} on {tid} does not apply: {res.reason}")
            why = screen.check(res.source, seeds["single_call"])
            c = caught.setdefault(kind, [0, 0])
            c[0] += why is not None
            c[1] += 1
            print(f"  {tid:20s} {kind:16s} {'caught' if why else 'MISSED'}: {why or ''}"[:160])
    s, g = totals["seed"], totals["legit"]
    print(f"false positives on the seeds: {s[0]}/{s[1]}")
    print(f"false positives on legitimate edits: {g[0]}/{g[1]} ({len(LEGIT)} edits x 3 tasks)")
    for kind, (n, m) in caught.items():
        print(f"echo caught, {kind}: {n}/{m}")


if __name__ == "__main__":
    main()
