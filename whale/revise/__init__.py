"""Harness Learning's revision loop: report → proposer → Apply → score → reward → Select."""

from whale.revise.edits import ApplyResult, Edit, EditFormatError, apply_edits, parse_blocks

__all__ = ["ApplyResult", "Edit", "EditFormatError", "apply_edits", "parse_blocks"]
