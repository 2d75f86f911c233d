"""The runtime part of every command's config (including where rollouts run: `executor`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from whale.config import ConfigError, FieldError, above, at_least, part
from whale.harness.budget import Budget, Limits, PythonToolLimits
from whale.harness.executor import ExecutorConfig, make_executor
from whale.harness.packages import check_packages, resolve_packages
from whale.harness.runtime import Runtime
from whale.harness.sandbox import Sandbox, SandboxKind
from whale.harness.tools.config import parse_tools
from whale.harness.tools.host import ToolsUnavailable
from whale.models.base import MAX_TEMPERATURE, ChatModel

# Budget fields that may be 0 (a run that may not call the model at all is a real setting);
# every other number of the budget and the limits must be positive.
_MAY_BE_ZERO = {"model_calls", "retrievals", "tool_calls"}
# Ray actors rebuild the Runtime elsewhere (ray_specs.RuntimeSpec), without a tools process.
RAY_REFUSAL = ("user tools run in a tools process on this machine, which Ray actors cannot "
               'reach: use runtime.executor.kind = "local"')  # fmt: skip


@dataclass
class RuntimeConfig:
    # "auto" (bubblewrap unless setuid, else nsjail, else refuse), "nsjail", "bwrap"; "unsafe" only
    # through --unsafe-no-sandbox.
    sandbox: SandboxKind = "auto"
    budget: Budget = field(default_factory=Budget)
    limits: Limits = field(default_factory=Limits)
    python: PythonToolLimits = field(default_factory=PythonToolLimits)
    temperature: float = 0.0  # solver sampling when the harness does not say
    seed: int = 0
    # Fresh jailed workers started ahead of need; -1: twice the command's workers.
    warm: int = -1
    # Where rollouts run: local threads (the default) or Ray actors (`executor.kind = "ray"`).
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    # The user's tools: NAME = "module:function" (or a table with `calls`, `timeout_s`), and
    # `mcp.SERVER = { command = [...] }` (whale.harness.tools.config). Part of the outcome
    # fingerprint and fixed on resume: tools change what runs produce.
    tools: dict[str, Any] = field(default_factory=dict)
    # Third-party packages a harness may import (whale.harness.packages): a list of
    # requirements, installed once into a cached folder, or a virtual environment's path;
    # empty: the standard library only. Part of the outcome fingerprint and fixed on resume.
    packages: list[str] | str = field(default_factory=list)

    def validate(self) -> None:
        """Ranges, checked by `whale.config.build` (which has checked the types)."""
        if self.sandbox not in ("auto", "nsjail", "bwrap", "unsafe"):
            raise ValueError(f"sandbox: unknown {self.sandbox!r} (auto, nsjail, bwrap, unsafe)")
        at_least(self, 0.0, "temperature")
        if self.temperature > MAX_TEMPERATURE:  # Sampling's range: no server gets more
            raise ValueError(f"temperature: must be at most {MAX_TEMPERATURE:g} "
                             f"(got {self.temperature!r})")  # fmt: skip
        at_least(self, -1, "warm")
        for name in ("budget", "limits", "python"):
            obj = getattr(self, name)
            with part(name):
                for f in dataclasses.fields(obj):
                    value = getattr(obj, f.name)
                    if isinstance(value, bool) or not isinstance(value, int | float):
                        continue  # None (no cap) and non-numbers
                    if name == "budget" and f.name in _MAY_BE_ZERO:
                        at_least(obj, 0, f.name)
                    else:
                        above(obj, 0, f.name)
        with part("executor"):
            self.executor.validate()
        parse_tools(self.tools, callables=False)
        check_packages(self.packages)
        if self.tools and self.executor.kind == "ray":
            raise FieldError("tools", RAY_REFUSAL)


def make_runtime(cfg: RuntimeConfig, model: ChatModel | None, workers: int = 1) -> Runtime:
    """The Runtime `cfg` describes, with its executor attached (`Runtime.close()` closes it).
    ExecutorUnavailable (e.g. kind "ray" without Ray installed) is raised here, before any
    run starts, and so is a ConfigError for `packages` (whose folder is built or checked
    here: whale.harness.packages)."""
    if cfg.sandbox not in ("auto", "nsjail", "bwrap", "unsafe"):
        raise ValueError(f"unknown sandbox {cfg.sandbox!r} (auto, nsjail, bwrap, unsafe)")
    try:
        tools = parse_tools(cfg.tools, callables=False)
    except FieldError as e:
        raise ConfigError(f"runtime.{e}", f"runtime.{e.field}") from None
    if tools and cfg.executor.kind == "ray":
        raise ConfigError(f"runtime.tools: {RAY_REFUSAL}", "runtime.tools")
    packages = resolve_packages(cfg.packages)  # built here, once, before any run starts
    rt = Runtime(
        model=model,
        budget=cfg.budget,
        limits=cfg.limits,
        python_limits=cfg.python,
        sandbox=Sandbox(cfg.sandbox),
        temperature=cfg.temperature,
        seed=cfg.seed,
        warm=2 * workers if cfg.warm < 0 else cfg.warm,
        executor=make_executor(cfg.executor),
        tools=tools,
        packages=packages,
    )
    if tools:  # start the tools process now: a tool that does not import fails before any run
        try:
            rt.tool_specs()
        except ToolsUnavailable as e:
            rt.close()
            raise ConfigError(f"runtime.{e}", f"runtime.{e.field or 'tools'}") from None
    return rt
