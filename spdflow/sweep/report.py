"""The sweep report: ``sweep.json`` (versioned schema), ``sweep.md`` and ``sweep.html``.

Built only from each point's ``report.json`` (read with :func:`spdflow.report.model.load_report`)
and ``outputs.jsonl``: a table of every point, the best point per objective, and plots of
throughput against the K-list, one line per proposer and one plot per batch size.
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spdflow.files import canonical_json, sha256_text, write_bytes_atomic, write_text_atomic

SWEEP_REPORT_VERSION = 1

#: objective (a PointMetrics field) -> ("max" or "min" is best, column label)
OBJECTIVES = {
    "decode_tokens_per_s": ("max", "decode tok/s"),
    "e2e_tokens_per_s": ("max", "e2e tok/s"),
    "acceptance_length": ("max", "AL"),
    "tpot_median_ms": ("min", "TPOT ms"),
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PointMetrics(_Model):
    """The numbers the sweep compares, copied from the point's report.json."""

    decode_tokens_per_s: float | None = Field(None, description="Decode throughput (metrics.decode_tokens_per_s).")
    e2e_tokens_per_s: float | None = Field(None, description="End-to-end throughput (metrics.e2e_tokens_per_s).")
    acceptance_length: float | None = Field(None, description="Mean acceptance length (metrics.mean_acceptance_length).")
    tpot_median_ms: float | None = Field(None, description="Median time per output token (ms).")
    ttft_median_ms: float | None = Field(None, description="Median time to first token (ms).")
    generated_tokens: int | None = Field(None, description="Tokens generated over all requests.")
    lossless: bool | None = Field(None, description="Tokens identical to the no-spec baseline; null when not checked.")


class PointResult(_Model):
    """One point of the sweep and how it ended."""

    id: str = Field(description="Point id: a slug of its values plus the first 8 hex of its key; names its dir.")
    label: str = Field(description="The point's own keys as key=value.")
    assignments: dict[str, Any] = Field(description="The point's own keys (matrix or include) and values.")
    key: str = Field(description="sha256 of the point's recipe (less name/output), root and lossless flag.")
    dir: str = Field(description="The point's run dir.")
    status: Literal["ok", "failed", "interrupted", "not_run"] = Field(description="How the point's run ended.")
    ran: Literal["now", "earlier", "no"] = Field(description="now: in this sweep run; earlier: finished in an earlier one (skipped); no: not run.")
    reason: str = Field("", description="Why it was skipped, or the error of a failed point.")
    exit_code: int | None = Field(None, description="The point process's exit code (spdflow run's codes).")
    duration_s: float | None = Field(None, description="Wall time of the point's process in this sweep run (s).")
    host: str | None = Field(None, description="The host the point ran on.")
    proposer: str | None = Field(None, description="proposer.uses of the point's recipe (null: no-spec).")
    k_list: list[int] = Field(default_factory=list, description="The sorted K-list of the point's recipe.")
    batch_size: int | None = Field(None, description="specialization.batch_size of the point's recipe.")
    metrics: PointMetrics | None = Field(None, description="From report.json; null when the point did not finish.")
    outputs_sha256: str | None = Field(None, description="sha256 of every request's generated token ids (outputs.jsonl), "
                                       "equal across executors for the same point.")


class Best(_Model):
    point: str = Field(description="Id of the best point.")
    value: float = Field(description="Its value of the objective.")


class SweepReport(_Model):
    """Everything ``sweep.json`` holds."""

    sweep_version: Literal[1] = Field(SWEEP_REPORT_VERSION, description="Schema version of this file.")
    name: str = Field(description="The sweep's name.")
    sweep_file: str = Field(description="The sweep file.")
    executor: str = Field(description="local or ray.")
    started_at: str = Field(description="Start of this sweep run, ISO 8601.")
    duration_s: float | None = Field(None, description="Wall time of this sweep run (s).")
    status: Literal["ok", "failed", "interrupted", "running"] = Field(
        description="ok: every point ok; failed: some point failed or did not run; interrupted; running (written while it runs).")
    points: list[PointResult] = Field(description="Every point, in sweep order.")
    best: dict[str, Best] = Field(default_factory=dict, description="Per objective, the best ok point that was not "
                                  "found lossy (objectives: " + ", ".join(OBJECTIVES) + ").")


# ------------------------------------------------------------------------------------ building


def point_result(point, point_dir: Path, ran: str, *, reason: str = "", outcome: dict | None = None,
                 duration_s: float | None = None) -> PointResult:
    """A point's result from its report.json (and the executor's outcome when it ran now)."""
    from spdflow.errors import SpdflowError
    from spdflow.report.model import load_report

    recipe = point.loaded.recipe
    result = PointResult(id=point.id, label=point.label(), assignments=dict(point.assignments), key=point.key,
                         dir=str(point_dir), status="not_run", ran=ran, reason=reason,
                         proposer=recipe.proposer.uses if recipe.proposer else None, k_list=recipe.k_list(),
                         batch_size=recipe.specialization.batch_size, duration_s=duration_s)
    if outcome is not None:
        result.exit_code, result.host = outcome.get("exit_code"), outcome.get("host")
    report = None
    if (point_dir / "report.json").is_file() and ran != "no":
        try:
            report = load_report(point_dir)
        except SpdflowError as exc:
            result.reason = exc.message
    if report is not None:
        result.status = report.status
        m = report.metrics
        if m is not None:
            result.metrics = PointMetrics(
                decode_tokens_per_s=m.decode_tokens_per_s, e2e_tokens_per_s=m.e2e_tokens_per_s,
                acceptance_length=m.mean_acceptance_length, generated_tokens=m.generated_tokens,
                tpot_median_ms=None if m.tpot_median_s is None else round(m.tpot_median_s * 1000, 3),
                ttft_median_ms=None if m.ttft_median_s is None else round(m.ttft_median_s * 1000, 3),
                lossless=report.lossless.identical if report.lossless and report.lossless.checked else None)
        result.outputs_sha256 = _outputs_sha256(point_dir / "outputs.jsonl") if report.status == "ok" else None
        if report.status != "ok" and report.error:
            result.reason = report.error.message
    if outcome is not None and ran == "now":
        code = outcome.get("exit_code")
        if report is not None and report.status == "ok" and code == 0:
            result.reason = ""
        else:
            # 130: the point's own Ctrl-C exit; negative: killed by a signal before it could say so
            interrupted = code == 130 or (code is not None and code < 0) or (report is not None and report.status == "interrupted")
            result.status = "interrupted" if interrupted else "failed"
            result.reason = ((report.error.message if report is not None and report.error else "")
                             or outcome.get("log_tail") or f"the point exited with code {code}")
    return result


def _outputs_sha256(path: Path) -> str | None:
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    tokens = [[row.get("request"), row.get("tokens")] for row in rows]
    return sha256_text(canonical_json(tokens))


def best_points(points: list[PointResult]) -> dict[str, Best]:
    """Per objective, the best ok point whose output was not found to differ from no-spec."""
    best: dict[str, Best] = {}
    for objective, (direction, _) in OBJECTIVES.items():
        candidates = [(getattr(p.metrics, objective), p.id) for p in points
                      if p.status == "ok" and p.metrics is not None and p.metrics.lossless is not False
                      and getattr(p.metrics, objective) is not None]
        if candidates:
            value, point = (max if direction == "max" else min)(candidates, key=lambda c: c[0])
            best[objective] = Best(point=point, value=value)
    return best


# ------------------------------------------------------------------------------------ writing


def write_sweep_json(out: Path, sweep: SweepReport) -> Path:
    sweep.best = best_points(sweep.points)
    path = out / "sweep.json"
    write_text_atomic(path, sweep.model_dump_json(indent=2) + "\n")
    return path


def write_sweep_report(out: Path, sweep: SweepReport) -> dict[str, Path]:
    """sweep.json, sweep.md, sweep.html and plots/*.png in ``out``."""
    paths = {"json": write_sweep_json(out, sweep)}
    plots = render_plots(sweep)
    plot_dir = out / "plots"
    files = {}
    for name, title, png in plots:
        plot_dir.mkdir(exist_ok=True)
        write_bytes_atomic(plot_dir / f"{name}.png", png)
        files[name] = (title, f"plots/{name}.png")
    paths["md"] = out / "sweep.md"
    write_text_atomic(paths["md"], render_markdown(sweep, files))
    paths["html"] = out / "sweep.html"
    write_text_atomic(paths["html"], render_html(sweep, plots))
    return paths


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table_rows(sweep: SweepReport) -> tuple[list[str], list[list[str]]]:
    """The point table shared by sweep.md and sweep.html."""
    keys = list(dict.fromkeys(k for p in sweep.points for k in p.assignments))
    header = ["point", *keys, "status", "decode tok/s", "e2e tok/s", "AL", "TPOT ms", "lossless", "note"]
    winners = {}
    for objective, best in sweep.best.items():
        winners.setdefault(best.point, []).append(OBJECTIVES[objective][1])
    rows = []
    from spdflow.sweep.spec import short_value

    for p in sweep.points:
        m = p.metrics or PointMetrics()
        status = p.status + (" (earlier)" if p.ran == "earlier" else "")
        note = "best: " + ", ".join(winners[p.id]) if p.id in winners else (p.reason if p.status != "ok" else "")
        rows.append([p.id, *[short_value(p.assignments[k]) if k in p.assignments else "" for k in keys], status,
                     _fmt(m.decode_tokens_per_s, 1), _fmt(m.e2e_tokens_per_s, 1), _fmt(m.acceptance_length),
                     _fmt(m.tpot_median_ms, 2), _fmt(m.lossless), note])
    return header, rows


def _summary(sweep: SweepReport) -> list[str]:
    counts: dict[str, int] = {}
    for p in sweep.points:
        counts[p.status] = counts.get(p.status, 0) + 1
    earlier = sum(p.ran == "earlier" for p in sweep.points)
    lines = [f"{len(sweep.points)} points: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
             + (f" ({earlier} finished in an earlier run)" if earlier else "") + f"; executor {sweep.executor}; "
             f"status {sweep.status}."]
    for objective, best in sweep.best.items():
        lines.append(f"Best {OBJECTIVES[objective][1]}: {best.point} ({_fmt(best.value)}).")
    lossy = [p.id for p in sweep.points if p.metrics and p.metrics.lossless is False]
    if lossy:
        lines.append(f"NOT lossless (excluded from best): {', '.join(lossy)}.")
    lines.append("Timings of points that ran at the same time share the machine; compare them with care, "
                 "or run with --jobs 1.")
    return lines


def render_markdown(sweep: SweepReport, plot_files: dict[str, tuple[str, str]]) -> str:
    header, rows = table_rows(sweep)
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = [f"# Sweep {sweep.name}", "", *_summary(sweep), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    for title, path in plot_files.values():
        lines += ["", f"## {title}", "", f"![{title}]({path})"]
    lines += ["", "Each point's own report: `points/<id>/report.md`.", ""]
    return "\n".join(lines)


_CSS = ("body{font-family:system-ui,sans-serif;margin:2rem;color:#111827}table{border-collapse:collapse;font-size:.9rem}"
        "th,td{border:1px solid #e5e7eb;padding:.3rem .6rem;text-align:left}th{background:#f3f4f6}"
        "td.num{text-align:right}img{max-width:100%}")


def render_html(sweep: SweepReport, plots: list[tuple[str, str, bytes]]) -> str:
    e = html.escape
    header, rows = table_rows(sweep)
    body = [f"<h1>Sweep {e(sweep.name)}</h1>", *[f"<p>{e(line)}</p>" for line in _summary(sweep)], "<table><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        link = f'<a href="points/{e(row[0])}/report.html">{e(row[0])}</a>'
        body.append("<tr><td>" + link + "</td>" + "".join(f"<td>{e(c)}</td>" for c in row[1:]) + "</tr>")
    body.append("</table>")
    for _, title, png in plots:
        body.append(f"<h2>{e(title)}</h2><img alt=\"{e(title)}\" src=\"data:image/png;base64,"
                    f"{base64.b64encode(png).decode()}\">")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>Sweep {e(sweep.name)}</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")


def render_plots(sweep: SweepReport) -> list[tuple[str, str, bytes]]:
    """Decode throughput against the K-list, one line per proposer, one plot per batch size."""
    ok = [p for p in sweep.points if p.status == "ok" and p.metrics and p.metrics.decode_tokens_per_s is not None]
    if not ok:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spdflow.report.plots import _figure, _png

    plots = []
    batches = sorted({p.batch_size for p in ok}, key=lambda b: b or 0)
    for batch in batches:
        points = [p for p in ok if p.batch_size == batch]
        k_lists = sorted({tuple(p.k_list) for p in points}, key=lambda k: (max(k), len(k), k))
        labels = ["[" + ",".join(map(str, k)) + "]" for k in k_lists]
        title = "Decode throughput vs K-list" + (f" (batch {batch})" if len(batches) > 1 else "")
        figure, axes = _figure(plt, title, "K-list", "decode tokens/s")
        for proposer in sorted({p.proposer or "no-spec" for p in points}):
            series = {}
            for p in points:
                if (p.proposer or "no-spec") == proposer:
                    series.setdefault(tuple(p.k_list), []).append(p.metrics.decode_tokens_per_s)
            xs = [i for i, k in enumerate(k_lists) if k in series]
            ys = [max(series[k_lists[i]]) for i in xs]
            axes.plot(xs, ys, marker="o", label=proposer)
        axes.set_xticks(range(len(labels)), labels)
        axes.legend(fontsize=8)
        plots.append((f"throughput_batch{batch}", title, _png(plt, figure)))
    return plots
