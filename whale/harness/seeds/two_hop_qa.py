"""Seed QA harness (the paper's): retrieve for the question, summarize, write a follow-up query
from the summary, retrieve again, answer from the summaries of both hops."""

K = 5


def passages(hits):
    return "\n".join(f"[{p['title']}] {p['text']}" for p in hits)


def summarize(env, question, hits):
    prompt = (
        f"Passages:\n{passages(hits)}\n\nQuestion: {question}\n"
        "Write the facts from these passages that help answer the question, in two sentences."
    )
    return env.llm([{"role": "user", "content": prompt}], max_tokens=160).text.strip()


def run(question, env):
    first = summarize(env, question, env.tools.retrieve(question, K))
    follow = (
        env.llm(
            [
                {
                    "role": "user",
                    "content": f"Question: {question}\nKnown so far: {first}\n"
                    "Write one short search query for the missing fact. Reply with the query only.",
                }
            ],
            max_tokens=32,
        )
        .text.strip()
        .splitlines()
    )
    query = follow[0] if follow and follow[0].strip() else question
    second = summarize(env, question, env.tools.retrieve(query, K))
    answer = env.llm(
        [
            {
                "role": "user",
                "content": f"Question: {question}\nFacts:\n{first}\n{second}\n"
                "Answer with a short phrase only (a name, place or year).",
            }
        ],
        max_tokens=24,
    ).text.strip()
    return answer.splitlines()[0].strip().rstrip(".") if answer else ""
