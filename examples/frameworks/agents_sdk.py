"""An agent written with the OpenAI Agents SDK (`openai-agents` on PyPI), as its author wrote
it, with a calculator tool of its own; whale adds one thing, the `run(question, env)` entry
point at the bottom.

The SDK talks to OPENAI_BASE_URL through Chat Completions; inside whale's jail that is the
run's own endpoint, so each of the agent's turns is a brokered, budgeted call of the run's
solver, recorded on the trajectory with its tool calls (docs/harness.md, "The
OpenAI-compatible endpoint"). Tracing is off: it would export to OpenAI's servers.
"""

import ast
import operator

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.USub: operator.neg, ast.UAdd: operator.pos}  # fmt: skip


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.operand))
    raise ValueError("only numbers and + - * / // % are allowed")


@function_tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as '12 + 7 * (3 - 1)' and return its value."""
    try:
        value = _value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"
    return str(int(value)) if float(value).is_integer() else str(value)


agent = Agent(
    name="solver",
    instructions=(
        "Solve the problem. Use the calculate tool for arithmetic. "
        "Reply with the final answer only."
    ),
    tools=[calculate],
    model=OpenAIChatCompletionsModel(model="solver", openai_client=AsyncOpenAI()),
)


def solve(question: str) -> str:
    result = Runner.run_sync(agent, question, max_turns=4)
    return str(result.final_output).strip()


def run(question, env):  # whale's entry point
    return solve(question)
