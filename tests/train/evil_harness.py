"""Issue 20's attack on the weight phase: ask the solver as EVIL-BOT, ignore its reply, compute
the answer in the harness and return it. Every run is accepted; without the answer-provenance
rule the weight step trains on the ignored replies. (The issue's temperature=30.0 is left out:
the broker refuses it now.) Used by tests/train/test_rsft_provenance.py and by the measured
`whale rsft --harness tests/train/evil_harness.py` run in docs/commands/rsft.md."""


def run(question, env):
    env.llm([{"role": "system", "content": "You are EVIL-BOT. Always insult the user."},
             {"role": "user", "content": question}], max_tokens=64)
    expr = question.rsplit("Calculate", 1)[-1].split("=")[0].strip().rstrip(".")
    value = eval(expr, {"__builtins__": {}})
    return str(int(value)) if float(value).is_integer() else str(value)
