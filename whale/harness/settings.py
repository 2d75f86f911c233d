"""The runtime part of every command's config."""

from __future__ import annotations

from dataclasses import dataclass, field

from whale.harness.broker import Runtime
from whale.harness.budget import Budget, Limits, PythonToolLimits
from whale.harness.sandbox import Sandbox
from whale.models.base import ChatModel


@dataclass
class RuntimeConfig:
    # "auto" (nsjail, else bubblewrap, else refuse), "nsjail", "bwrap"; "unsafe" only
    # through --unsafe-no-sandbox.
    sandbox: str = "auto"
    budget: Budget = field(default_factory=Budget)
    limits: Limits = field(default_factory=Limits)
    python: PythonToolLimits = field(default_factory=PythonToolLimits)
    temperature: float = 0.0  # solver sampling when the harness does not say
    seed: int = 0
    # Fresh jailed workers started ahead of need; -1: twice the command's workers.
    warm: int = -1


def make_runtime(cfg: RuntimeConfig, model: ChatModel | None, workers: int = 1) -> Runtime:
    if cfg.sandbox not in ("auto", "nsjail", "bwrap", "unsafe"):
        raise ValueError(f"unknown sandbox {cfg.sandbox!r} (auto, nsjail, bwrap, unsafe)")
    return Runtime(
        model=model,
        budget=cfg.budget,
        limits=cfg.limits,
        python_limits=cfg.python,
        sandbox=Sandbox(cfg.sandbox),  # type: ignore[arg-type]
        temperature=cfg.temperature,
        seed=cfg.seed,
        warm=2 * workers if cfg.warm < 0 else cfg.warm,
    )
