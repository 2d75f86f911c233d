"""The fields every operator command's config starts with: `adapt`, `search`, `cotrain`
(and `rsft`) and `diagnose` each run a seed harness with a frozen solver on a task, ask a
proposer for harnesses, and run them in one runtime. One definition, so a field means the same
in each and the resume rule (`whale.runs.resume`) sees the same names."""

from __future__ import annotations

from dataclasses import dataclass, field

from whale.harness import RuntimeConfig
from whale.models import ModelConfig
from whale.tasks import TaskConfig


def _proposer() -> ModelConfig:
    # A proposal is long (up to propose.max_tokens): its timeout is longer than a solver call's.
    return ModelConfig(name="qwen-coder-1.5b", timeout_s=600.0)


@dataclass
class OperatorFields:
    """task, seed harness, solver, proposer and runtime (a config may give `task` its own
    default by declaring the field again)."""

    task: TaskConfig = field(default_factory=lambda: TaskConfig(id="rg:basic_arithmetic"))
    harness: str = "single_call"
    solver: ModelConfig = field(default_factory=ModelConfig)
    proposer: ModelConfig = field(default_factory=_proposer)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
