"""Select: an unknown rule is an error, never a silent fall-back to best-of-g."""

import pytest

from whale.revise.select import Candidate, select


def _candidate(score):
    return Candidate(1, 0, "p", "c", True, "", "blocks", True, True, 1.0, score, score + 0.3)


def test_unknown_rule_is_a_value_error_naming_the_rule_and_the_known_ones():
    # Before the fix, "ratchett" advanced to a candidate scoring below its parent (best-of-g).
    with pytest.raises(ValueError, match=r"'ratchett'.*ratchet, best-of-g"):
        select("ratchett", "p", 0.9, [_candidate(0.1)])  # type: ignore[arg-type]


def test_unknown_rule_is_refused_even_without_valid_candidates():
    with pytest.raises(ValueError, match="unknown Select rule"):
        select("best_of_g", "p", 0.5, [])  # type: ignore[arg-type]
