"""The run machinery every command shares: the rollout ledger (`ledger`), the run directory,
its lock and its saved config (`rundir`), the outcome fingerprint (`fingerprint`), and the one
rule for what a resume may change (`resume`). Its errors are typed (`errors`)."""

from whale.runs.errors import (
    OutNotADirectory,
    RecordError,
    ResumeMismatch,
    RunDirError,
    RunDirInUse,
    RunDirNotEmpty,
)
from whale.runs.fingerprint import outcome_fingerprint
from whale.runs.ledger import OutcomeStore, ledger_row
from whale.runs.resume import (
    changed_fields,
    check_seed,
    check_splits,
    may_change,
    record_seed,
    refuse_changes,
    resumable,
)
from whale.runs.rundir import (
    check_out,
    hold_run_dir,
    load_run_config,
    new_run_dir,
    save_run_config,
)

__all__ = [
    "OutNotADirectory", "OutcomeStore", "RecordError", "ResumeMismatch", "RunDirError",
    "RunDirInUse", "RunDirNotEmpty", "changed_fields", "check_out", "check_seed",
    "check_splits",
    "hold_run_dir", "ledger_row", "load_run_config", "may_change", "new_run_dir",
    "outcome_fingerprint", "record_seed", "refuse_changes", "resumable", "save_run_config",
]  # fmt: skip
