"""Seed harness (Reasoning Gym): one solver call, read the answer off the reply."""


def run(question, env):
    reply = env.llm(
        [
            {
                "role": "system",
                "content": "Solve the problem. End your reply with a line 'Answer: <answer>'.",
            },
            {"role": "user", "content": question},
        ]
    )
    for line in reversed(reply.text.strip().splitlines()):
        if line.lower().startswith("answer:"):
            return line.split(":", 1)[1].strip()
    return reply.text.strip()
