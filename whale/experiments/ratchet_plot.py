"""The Harness Learning ratchet curve (the paper's Figure 4): each proposer's held-out score of
the harness its ratchet kept after round 0 (the seed), 1, ..., averaged over the unseen
families, with the standard error over families; a table of the same numbers and a PNG drawn
from `evaluate/summary.json`'s readings. One family: no SE (shown as "-")."""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from whale.experiments.cells import fmt
from whale.records import write_atomic
from whale.train.proposer.evaluate import FamilyReading


def ratchet_curves(readings: Sequence[FamilyReading]) -> dict[str, list[tuple[float, float, int]]]:
    """proposer -> per round (mean over families, SE over families or nan, families). A round
    counts the families whose ratchet reached it (a run cut short has fewer)."""
    out: dict[str, list[tuple[float, float, int]]] = {}
    for name in dict.fromkeys(r.proposer for r in readings):
        mine = [r.ratchet_rounds for r in readings if r.proposer == name]
        rows = []
        for k in range(max((len(x) for x in mine), default=0)):
            v = [x[k] for x in mine if len(x) > k]
            se = statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else math.nan
            rows.append((statistics.fmean(v), se, len(v)))
        out[name] = rows
    return out


def ratchet_lines(readings: Sequence[FamilyReading], png: Path,
                  label: Callable[[str], str] = str) -> list[str]:  # fmt: skip
    """Markdown: the curve's table and the image (written to `png`, linked by its name)."""
    curves = ratchet_curves(readings)
    if not any(curves.values()):
        return []
    rounds = max(len(v) for v in curves.values())
    lines = ["", "Ratchet: held-out score of the kept harness after each round (mean over "
             "families ± SE over families; round 0 is the seed):", "",
             "| proposer | " + " | ".join(f"round {k}" for k in range(rounds)) + " | families |",
             "|---|" + "---|" * (rounds + 1)]  # fmt: skip
    for name, rows in curves.items():
        cells = [f"{fmt(m)} ± {fmt(se)}" if not math.isnan(se) else fmt(m) for m, se, _ in rows]
        cells += ["-"] * (rounds - len(rows))
        lines.append(f"| {label(name)} | " + " | ".join(cells) + f" | {rows[0][2]} |")
    _draw(curves, png, label)
    return lines + ["", f"![ratchet: held-out score after each round]({png.name})"]


def _draw(curves: dict[str, list[tuple[float, float, int]]], path: Path,
          label: Callable[[str], str]) -> None:  # fmt: skip
    # The Agg canvas directly, not pyplot (as whale.schedule.curves draws).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, rows in curves.items():
        ses = [0.0 if math.isnan(se) else se for _, se, _ in rows]
        ax.errorbar(range(len(rows)), [m for m, _, _ in rows], yerr=ses, marker="o", capsize=3,
                    label=label(name))  # fmt: skip
    ax.set_xlabel("ratchet round (0: the seed)")
    ax.set_ylabel("held-out accuracy of the kept harness")
    ax.set_title("ratchet on the unseen families (mean ± SE over families)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_atomic(path, buf.getvalue())
