"""Seed harness of the orders example: a tool-calling loop over the read-only `sql` tool.

The solver is offered one tool, `sql`, as an OpenAI function schema. Each call it makes is
run through `env.tools.sql` (outside the jail, through whale's broker, which counts and
records it), the result goes back as a `tool` message, and the solver is called again, up to
TURNS times. A reply that calls no tool is the answer (so a model that never calls the tool
still answers, from its text). Once the solver has results and stops finding new ones (it
repeats a call) or the turns are spent, one last call without tools answers the question
from the queries and their results.
"""

import json
import re

TURNS = 4
SYSTEM = (
    "You answer questions about a shop's orders database (SQLite). Tables: customers(id, name, "
    "city), products(id, name, category, list_price), orders(id, customer_id, product_id, "
    "quantity, unit_price, order_date as 'YYYY-MM-DD').\n"
    "Always call the sql tool first, with one SELECT query that computes the answer: reply "
    'with only {"name": "sql", "arguments": {"query": "SELECT ..."}}. When you have seen its '
    "result, reply with the answer value only."
)
FINAL = (
    "Answer the question from the SQL query's result. Reply with the answer value only: a "
    "number, a name or a date, nothing else."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "sql",
            "description": "Run one read-only SQLite SELECT query on the orders database and "
            "return the columns and rows it selects.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "one SELECT statement"}},
                "required": ["query"],
            },
        },
    }
]


def answer_of(text):
    """The value after "Answer:", else the reply's last non-empty line."""
    match = re.search(r"answer\s*:\s*(.+)", text, re.IGNORECASE)
    if match:
        return match.group(1).strip()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_call(call, env):
    """The query a tool call asks for and the text its result is sent back as (errors too)."""
    args = call["arguments"]
    query = args.get("query") if isinstance(args, dict) else None
    if call["name"] != "sql" or not isinstance(query, str):
        return None, 'error: call the sql tool with {"query": "SELECT ..."}'
    try:
        # the result as json.dumps writes it (the tool caps it at 4,000 characters): the weight
        # phase then counts this turn as the work behind the answer (whale.train.provenance)
        return query, json.dumps(env.tools.sql(query))
    except Exception as e:  # a refused query, an SQL error, a timeout: the model sees why
        return query, f"error: {e}"


def run(question, env):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    results = []
    for _ in range(TURNS):
        reply = env.llm(messages, tools=TOOLS, max_tokens=256)
        if not reply.tool_calls:
            return answer_of(reply.text)
        messages.append(reply.message)
        new = False
        for call in reply.tool_calls:
            query, out = run_call(call, env)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
            if query is not None and (query, out) not in results:
                results.append((query, out))
                new = True
        if not new:  # the same calls again: it has found what it will find
            break
    if not results:
        return ""
    found = "\n".join(f"SQL query: {q}\nResult: {out}" for q, out in results)
    reply = env.llm(
        [
            {"role": "system", "content": FINAL},
            {"role": "user", "content": f"Question: {question}\n{found}"},
        ],
        max_tokens=64,
    )
    return answer_of(reply.text)
