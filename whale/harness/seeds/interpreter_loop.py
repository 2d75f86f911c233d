"""Seed harness: the solver writes Python, it is run, the output is fed back, up to N turns."""

import re

TURNS = 4
SYSTEM = (
    "Solve the problem by writing Python code in a ```python block; it will be run and you "
    "will see its output. When you know the answer, reply with a line 'Answer: <answer>'."
)


def run(question, env):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    last_output = ""
    for _ in range(TURNS):
        reply = env.llm(messages)
        messages.append({"role": "assistant", "content": reply.text})
        match = re.search(r"^\s*answer:\s*(.+)$", reply.text, re.IGNORECASE | re.MULTILINE)
        code = re.search(r"```(?:python)?\n(.*?)```", reply.text, re.DOTALL)
        if match and not code:
            return match.group(1).strip()
        if not code:
            return reply.text.strip()
        result = env.tools.python(code.group(1), timeout=10)
        last_output = str(result).strip()
        messages.append({"role": "user", "content": f"Output:\n{last_output[:2000]}"})
    return last_output.splitlines()[-1] if last_output else ""
