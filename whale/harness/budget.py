"""Budgets and resource limits of one harness run. Every field is enforced (see broker.py and
sandbox.py) and has a test in tests/harness/."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """What one run may spend. Defaults are the papers' QA defaults."""

    model_calls: int = 12
    retrievals: int = 12
    tool_calls: int = 12
    model_call_timeout_s: float = 120.0
    run_timeout_s: float = 900.0
    max_tokens_per_call: int = 1024
    # None: no cap on the sum of completion tokens over the run.
    max_total_tokens: int | None = None


@dataclass(frozen=True)
class Limits:
    """Operating-system limits of the isolated worker process (and of the python tool)."""

    memory_mb: int = 1024  # RLIMIT_AS
    cpu_s: int = 900  # RLIMIT_CPU
    file_size_mb: int = 64  # RLIMIT_FSIZE: largest file the harness may write
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 16  # RLIMIT_NPROC, per run (each run gets its own uid)
    scratch_mb: int = 256  # total bytes the harness may leave in its scratch folder
    output_bytes: int = 4 * 1024 * 1024  # stdout+stderr; past this the run is killed
    message_bytes: int = 8 * 1024 * 1024  # one request over the broker pipe
    # The longest answer a run may return (past it the run is an `error`): an answer is graded,
    # written to the ledger and shown to proposers, so it is kept far below message_bytes.
    answer_chars: int = 100_000


@dataclass(frozen=True)
class PythonToolLimits:
    """Limits of `env.tools.python`: each call is a fresh sandboxed interpreter."""

    timeout_s: float = 10.0  # the most a call may ask for; a harness may ask for less
    memory_mb: int = 512
    output_chars: int = 8000  # stdout/stderr returned to the harness, each
    processes: int = 8
