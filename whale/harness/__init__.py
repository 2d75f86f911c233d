"""The harness runtime: isolated workers, a broker that enforces budgets, trajectories."""

from pathlib import Path

from whale.harness.broker import Retriever, harness_hash
from whale.harness.budget import Budget, Limits, PythonToolLimits
from whale.harness.bundle import BundleError, read_folder
from whale.harness.runtime import Executor, ExecutorUnavailable, Rollout, Runtime
from whale.harness.sandbox import Sandbox, SandboxUnavailable
from whale.harness.settings import RuntimeConfig, make_runtime
from whale.harness.trajectory import (
    STATUSES,
    TRAJECTORY_VERSION,
    Failure,
    Trajectory,
    read_failure,
)

SEEDS_DIR = Path(__file__).parent / "seeds"


def seed_names() -> list[str]:
    return sorted(p.stem for p in SEEDS_DIR.glob("*.py"))


def load_harness(name_or_path: str) -> str:
    """Source of a seed harness by name, of a harness file by path, or of a harness folder
    by path (its files as one bundle: `whale.harness.bundle.read_folder`, BundleError when
    the folder breaks its rules)."""
    path = SEEDS_DIR / f"{name_or_path}.py"
    if "/" not in name_or_path and path.exists():
        return path.read_text()
    p = Path(name_or_path)
    if p.is_file():
        return p.read_text()
    if p.is_dir():
        return read_folder(p)
    raise FileNotFoundError(
        f"no harness {name_or_path!r}: not a seed ({', '.join(seed_names())}), a file nor a folder"
    )


__all__ = [
    "Budget", "BundleError", "Executor", "ExecutorUnavailable", "Failure", "Limits",
    "PythonToolLimits", "Retriever", "Rollout", "Runtime", "RuntimeConfig", "Sandbox",
    "SandboxUnavailable", "STATUSES", "TRAJECTORY_VERSION", "Trajectory", "harness_hash",
    "load_harness", "make_runtime", "read_folder", "read_failure", "seed_names", "SEEDS_DIR",
]  # fmt: skip
