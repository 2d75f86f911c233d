"""What produced an outcome, besides the harness and the question: the ledger's fingerprint.

Every ledger row (`whale.runs.ledger.OutcomeStore`) is keyed by (fingerprint, harness hash,
question id), so an outcome is reused only by a request that would have produced it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from whale.harness import RuntimeConfig
from whale.models import ModelConfig
from whale.tasks import TaskConfig


def outcome_fingerprint(task: TaskConfig, solver: ModelConfig, runtime: RuntimeConfig) -> str:
    """What, besides the harness and the question id, produced an outcome: the task (id,
    size, seed, config), the solver's identity (name, base_url, n_ctx, timeout_s) and the
    runtime (sandbox, budget, limits, python tool, temperature, seed, the user's tools and
    the allowed packages as configured; not `warm`, not the executor). Numbers are compared as
    floats (600 and 600.0 are one value). Not covered: a server that swaps the weights behind
    one model name; the code of a user's tool (its config names it, as a task's config names
    its data file); what a venv named by `packages` holds, and which release of a requirement
    its first build installed (whale.harness.packages)."""
    rt = asdict(runtime)
    rt.pop("warm", None)
    rt.pop("executor", None)  # where rollouts run does not change what they produce
    for optional in ("tools", "packages"):  # none: the fingerprint of ledgers from before them
        if not rt.get(optional):
            rt.pop(optional, None)
    s = solver
    t = asdict(task)
    if t.get("variant") == "canonical":
        del t["variant"]  # the questions as the family makes them: ledgers from before it match
    what = {
        "task": t,
        "solver": {"name": s.name, "base_url": s.base_url, "n_ctx": s.n_ctx,
                   "timeout_s": s.timeout_s},
        "runtime": rt,
    }  # fmt: skip
    text = json.dumps(_numbers_as_floats(what), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _numbers_as_floats(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _numbers_as_floats(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_numbers_as_floats(v) for v in x]
    if isinstance(x, int) and not isinstance(x, bool):
        return float(x)
    return x
