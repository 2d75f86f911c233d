"""An agent written with the `openai` client, as its author wrote it; whale adds one thing, the
`run(question, env)` entry point at the bottom.

Inside whale's jail, `openai.OpenAI()` reads OPENAI_BASE_URL and OPENAI_API_KEY, which point at
the run's own endpoint: every request is a brokered, budgeted, recorded call of the run's
solver (docs/harness.md, "The OpenAI-compatible endpoint"). Outside whale it runs against any
OpenAI-compatible server the same way.
"""

import re

import openai

INSTRUCTIONS = "Solve the problem. End your reply with a line 'Answer: <the answer>'."


def solve(question: str) -> str:
    client = openai.OpenAI()
    reply = client.chat.completions.create(
        model="solver",
        messages=[
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": question},
        ],
        max_tokens=400,
    )
    text = reply.choices[0].message.content or ""
    found = re.findall(r"Answer:\s*(.+)", text)
    return found[-1].strip() if found else text.strip()


def run(question, env):  # whale's entry point
    return solve(question)
