"""Meta-Harness search: the on-disk archive, the proposer agent's read-only tools, the agent,
the patience rule, the loop (`loop.search`), the harness operator and `whale search`
(`run.run_search`)."""

from whale.metaharness.archive import Archive, ArchiveError, CandidateMeta
from whale.metaharness.patience import Patience
from whale.metaharness.tools import ArchiveTools, ToolCall, ToolRefused, parse_call

__all__ = [
    "Archive", "ArchiveError", "ArchiveTools", "CandidateMeta", "Patience", "ToolCall",
    "ToolRefused", "parse_call",
]  # fmt: skip
