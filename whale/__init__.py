"""whale: optimize an LLM agent as a pair (weights, harness)."""

from whale.revise.edits import ApplyResult, apply_edits

__all__ = ["ApplyResult", "apply_edits"]
__version__ = "0.1.0"
