"""PNG plots of a run's metrics, for report.html (inline) and report.md (linked files).

matplotlib is imported inside :func:`render_plots` with the Agg backend: lint and the CLI
never pay for it, and no display is needed.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

from spdflow.report.metrics import Metrics

_BLUE = "#2563eb"
_GREEN = "#059669"
_AMBER = "#d97706"
_VIOLET = "#7c3aed"


@dataclass(frozen=True)
class Plot:
    """One rendered plot."""

    name: str  # file stem, e.g. "k_usage"
    title: str
    png: bytes


def _figure(plt, title: str, xlabel: str, ylabel: str):
    figure, axes = plt.subplots(figsize=(5.2, 3.0), dpi=110)
    axes.set_title(title, fontsize=11, loc="left")
    axes.set_xlabel(xlabel, fontsize=9)
    axes.set_ylabel(ylabel, fontsize=9)
    axes.tick_params(labelsize=8)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    axes.grid(axis="y", color="#e5e7eb", linewidth=0.8)
    axes.set_axisbelow(True)
    return figure, axes


def _png(plt, figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()


def _bars(plt, title, xlabel, ylabel, histogram: dict[int, int], color) -> bytes:
    figure, axes = _figure(plt, title, xlabel, ylabel)
    keys = sorted(histogram)
    axes.bar([str(k) for k in keys], [histogram[k] for k in keys], color=color, width=0.6)
    return _png(plt, figure)


def _per_position(plt, metrics: Metrics) -> bytes:
    figure, axes = _figure(plt, "Per-position acceptance", "draft position (1 = first proposed token)", "accepted ÷ reached")
    rates = metrics.per_position_acceptance
    positions = [str(i + 1) for i in range(len(rates))]
    axes.bar(positions, rates, color=_GREEN, width=0.6)
    axes.set_ylim(0, 1.05)
    for x, (rate, reached) in enumerate(zip(rates, metrics.per_position_proposed)):
        axes.annotate(f"n={reached}", (x, rate), ha="center", va="bottom", fontsize=7, color="#6b7280")
    return _png(plt, figure)


def _step_cost(plt, metrics: Metrics) -> bytes:
    figure, axes = _figure(plt, "Verify time per K", "K (decode shape seq_len K+1)", "median verify time (ms)")
    batches = sorted({c.batch for c in metrics.step_costs})
    colors = [_VIOLET, _BLUE, _GREEN, _AMBER]
    for i, batch in enumerate(batches):
        costs = sorted((c for c in metrics.step_costs if c.batch == batch), key=lambda c: c.k)
        axes.plot([c.k for c in costs], [c.verify_median_s * 1000 for c in costs], marker="o", linewidth=1.6,
                  color=colors[i % len(colors)], label=f"batch {batch}")
        for c in costs:
            axes.annotate(f"n={c.steps}", (c.k, c.verify_median_s * 1000), textcoords="offset points", xytext=(0, 5),
                          ha="center", fontsize=7, color="#6b7280")
    axes.set_xticks(sorted({c.k for c in metrics.step_costs}))
    axes.set_ylim(bottom=0)
    if len(batches) > 1:
        axes.legend(fontsize=8, frameon=False)
    return _png(plt, figure)


def render_plots(metrics: Metrics) -> list[Plot]:
    """The report's plots for ``metrics``; plots without data are left out."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plots = []
    if metrics.k_histogram:
        png = _bars(plt, "K usage", "chosen K", "decode steps", metrics.k_histogram, _BLUE)
        plots.append(Plot("k_usage", "K usage (decode steps per chosen K)", png))
    if metrics.per_position_acceptance:
        plots.append(Plot("per_position_acceptance", "Per-position acceptance", _per_position(plt, metrics)))
    if metrics.accepted_length_histogram:
        png = _bars(
            plt, "Accepted length", "tokens gained per step (accepted + 1)", "row-steps",
            metrics.accepted_length_histogram, _AMBER,
        )
        plots.append(Plot("accepted_length", "Accepted length (accepted + 1 per row-step)", png))
    if metrics.step_costs:
        plots.append(Plot("step_cost", "Verify time per K (median per batch)", _step_cost(plt, metrics)))
    return plots
