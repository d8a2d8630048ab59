"""Write a run report as report.json, report.md and report.html, and summarize it in the terminal.

The Markdown and the HTML share one list of :class:`Section` (title, sentences, table), so the
two always say the same thing; the HTML adds the plots (inline PNG data URIs, no external
file or network fetch) and a glossary built from the metric field descriptions. Every file is
written to a temp file in the run directory and renamed into place, so a reader never sees a
half-written report.
"""
from __future__ import annotations

import base64
import html
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from spdflow.report.metrics import Metrics, compute_metrics, glossary
from spdflow.report.model import RunReport

# ------------------------------------------------------------------------------------------
# formatting


def fmt_s(value: float | None) -> str:
    """Seconds, in ms below one second."""
    if value is None:
        return "—"
    return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"


def fmt_pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def fmt_num(value: float | int | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def fmt_k_usage(metrics: Metrics) -> str:
    """``K=0: 12 (30.0 %) · K=4: 28 (70.0 %)``."""
    total = sum(metrics.k_histogram.values())
    if not total:
        return "—"
    return " · ".join(f"K={k}: {n} ({fmt_pct(n / total)})" for k, n in sorted(metrics.k_histogram.items()))


def lossless_verdict(report: RunReport) -> str:
    """One phrase on whether the output matched the no-spec baseline."""
    lossless = report.lossless
    if lossless is None or not lossless.checked:
        note = f" ({lossless.baseline})" if lossless and lossless.baseline else ""
        return f"not checked{note}"
    if lossless.identical:
        return f"identical to the baseline ({lossless.baseline or 'no-spec'})"
    ids = ", ".join(str(i) for i in lossless.mismatched_requests[:10]) or "?"
    return f"DIFFERS from the baseline in requests {ids} ({lossless.baseline or 'no-spec'})"


# ------------------------------------------------------------------------------------------
# the shared content


@dataclass
class Section:
    """One part of the report: a heading, some sentences, optionally a table."""

    title: str
    lines: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


def status_line(report: RunReport) -> str:
    """``ok · run tiny-varK-20260101T120000 · 12.31 s`` (plus the error when there is one)."""
    parts = [report.status.upper(), f"run {report.run_id}", fmt_s(report.duration_s)]
    if report.error is not None:
        where = f"{report.error.stage}: " if report.error.stage else ""
        parts.append(f"{where}{report.error.message}")
    return " · ".join(parts)


def speed_sentence(m: Metrics) -> str:
    """A plain-language reading of the speculation numbers."""
    if not m.decode_steps:
        return "No decode step ran."
    if not m.proposed_tokens:
        return (
            f"No speculation: {m.decode_steps} decode steps each gained one token per request "
            f"(AL 1.00); decode ran at {fmt_num(m.decode_tokens_per_s, 1)} tokens/s."
        )
    return (
        f"Each decode step gained {fmt_num(m.mean_acceptance_length)} tokens per request on average "
        f"(AL; 1.00 means no gain) with {fmt_pct(m.draft_acceptance_rate)} of drafts accepted; "
        f"{fmt_pct(m.padded_slot_fraction)} of verified positions held no proposal. "
        f"Decode ran at {fmt_num(m.decode_tokens_per_s, 1)} tokens/s — compare with a no-spec run "
        f"(spdflow bench) to know the speed-up."
    )


def _headline(m: Metrics, report: RunReport) -> Section:
    rows = [
        ["Mean acceptance length (AL)", fmt_num(m.mean_acceptance_length)],
        ["Draft acceptance rate (AR)", fmt_pct(m.draft_acceptance_rate)],
        ["Decode throughput", f"{fmt_num(m.decode_tokens_per_s, 1)} tokens/s"],
        ["End-to-end throughput", f"{fmt_num(m.e2e_tokens_per_s, 1)} tokens/s"],
        ["K usage", fmt_k_usage(m)],
        ["Padded-slot fraction", fmt_pct(m.padded_slot_fraction)],
        ["TTFT mean / median / p90", " / ".join(fmt_s(v) for v in (m.ttft_mean_s, m.ttft_median_s, m.ttft_p90_s))],
        ["TPOT mean / median", " / ".join(fmt_s(v) for v in (m.tpot_mean_s, m.tpot_median_s))],
        ["Requests / generated tokens", f"{m.requests} / {fmt_num(m.generated_tokens)}"],
        ["Generation wall time", fmt_s(m.wall_s)],
        ["Lossless", lossless_verdict(report)],
    ]
    if report.peak_rss_mb is not None:
        rows.append(["Peak RSS", f"{report.peak_rss_mb:,.0f} MiB"])
    return Section("Did it speed up?", [speed_sentence(m)], ["metric", "value"], rows)


def _time_split(m: Metrics) -> Section:
    rows = [
        ["propose", fmt_s(m.propose_s), fmt_pct(m.propose_fraction)],
        ["verify", fmt_s(m.verify_s), fmt_pct(m.verify_fraction)],
        ["host (outside propose and verify)", fmt_s(m.host_s), fmt_pct(m.host_fraction)],
        ["decode total", fmt_s(m.decode_time_s), fmt_pct(1.0 if m.decode_time_s else None)],
        ["prefill (not in decode)", fmt_s(m.prefill_time_s), ""],
    ]
    return Section("Time split", [], ["phase", "time", "share of decode"], rows)


def _speculation(m: Metrics) -> Section:
    lines = [
        f"Proposals on {fmt_pct(m.proposal_rate)} of row-steps; "
        f"{fmt_num(m.accepted_tokens)} of {fmt_num(m.proposed_tokens)} drafted tokens accepted; "
        f"AL over drafted row-steps only (vLLM): {fmt_num(m.mean_acceptance_length_drafted)}.",
    ]
    if m.per_position_acceptance:
        lines.append(
            "Per-position acceptance: "
            + " · ".join(f"#{i + 1} {fmt_pct(r)}" for i, r in enumerate(m.per_position_acceptance))
        )
    if m.accepted_length_histogram:
        lines.append(
            "Accepted length (accepted + 1): "
            + " · ".join(f"{a}: {n}" for a, n in sorted(m.accepted_length_histogram.items()))
        )
    total = sum(m.k_histogram.values())
    rows = [[str(k), str(n), fmt_pct(n / total)] for k, n in sorted(m.k_histogram.items())]
    return Section("Speculation", lines, ["K", "decode steps", "share"], rows)


def _per_request(m: Metrics) -> Section:
    rows = [
        [str(r.request), str(r.steps), str(r.proposed), str(r.accepted), fmt_pct(r.acceptance_rate), fmt_num(r.acceptance_length)]
        for r in m.per_request
    ]
    return Section("Per request", [], ["request", "steps", "proposed", "accepted", "AR", "AL"], rows)


def _stages(report: RunReport) -> Section:
    rows = [
        [s.name, s.status, s.reason, fmt_s(s.duration_s), (s.cache_key or "")[:16]]
        for s in report.stages
    ]
    return Section("Stages", [], ["stage", "status", "reason", "time", "cache key"], rows)


def _artifacts(report: RunReport) -> Section:
    rows = [
        [a.name, a.path, fmt_num(a.bytes), (a.sha256 or "")[:12]]
        for a in report.artifacts
    ]
    return Section("Artifacts", [], ["name", "path (in run dir)", "bytes", "sha256"], rows)


def _environment(report: RunReport) -> Section:
    lines = [f"spdflow {report.spdflow_version}; started {report.started_at}"]
    if report.recipe_path:
        lines.append(f"recipe {report.recipe_path} (sha256 {(report.recipe_sha256 or '?')[:12]})")
    env = report.environment
    if env is not None:
        lines.append(f"Python {env.python} on {env.platform} ({env.machine}, {env.cpu_count} CPUs)")
        lines.append(", ".join(f"{name} {version}" for name, version in env.packages.items() if version))
    if report.plugins:
        lines.append("plugins: " + ", ".join(f"{p.name} {p.version or ''}".strip() for p in report.plugins))
    return Section("Environment", lines)


def build_sections(report: RunReport) -> list[Section]:
    """The report's content, in reading order, shared by report.md and report.html."""
    sections = []
    m = report.metrics
    if m is not None:
        sections += [_headline(m, report), _speculation(m), _time_split(m)]
    else:
        sections.append(Section("Did it speed up?", ["Generation did not run: no metrics."]))
    sections += [_stages(report), _artifacts(report)]
    if m is not None and m.per_request:
        sections.append(_per_request(m))
    sections.append(_environment(report))
    return sections


# ------------------------------------------------------------------------------------------
# Markdown


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: RunReport, plot_files: dict[str, str] | None = None) -> str:
    """report.md: status line, sections as tables, links to the plot PNGs."""
    name = report.recipe.get("name", report.run_id)
    out = [f"# spdflow run: {name}", "", f"**{status_line(report)}**", ""]
    for section in build_sections(report):
        out += [f"## {section.title}", ""]
        for line in section.lines:
            out += [line, ""]
        if section.headers and section.rows:
            out.append("| " + " | ".join(section.headers) + " |")
            out.append("|" + "---|" * len(section.headers))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in section.rows]
            out.append("")
    if plot_files:
        out += ["## Plots", ""]
        out += [f"![{title}]({path})" for title, path in plot_files.items()]
        out.append("")
    out += ["Metric definitions: see the glossary in report.html.", ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------
# HTML

_CSS = """
:root { --fg:#111827; --muted:#6b7280; --line:#e5e7eb; --bg:#f9fafb; --card:#fff; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:14px/1.5 -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; }
main { max-width: 1080px; margin: 0 auto; padding: 28px 24px 48px; }
h1 { font-size: 22px; margin: 0 0 6px; }
h2 { font-size: 16px; margin: 28px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
p { margin: 6px 0; }
.status { display:inline-block; padding:2px 10px; border-radius:999px; font-weight:600; font-size:12px;
  letter-spacing:.04em; color:#fff; margin-right:8px; vertical-align: 2px; }
.status.ok { background:#059669; } .status.failed { background:#dc2626; } .status.interrupted { background:#d97706; }
.sub { color: var(--muted); }
.cards { display:grid; grid-template-columns: repeat(auto-fill, minmax(160px, 1fr)); gap:10px; margin:16px 0 4px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:10px 12px; }
.card .v { font-size:20px; font-weight:600; font-variant-numeric: tabular-nums; }
.card .k { font-size:12px; color:var(--muted); }
table { border-collapse: collapse; width:100%; background:var(--card); border:1px solid var(--line);
  border-radius:8px; overflow:hidden; font-variant-numeric: tabular-nums; }
th, td { text-align:left; padding:6px 10px; border-bottom:1px solid var(--line); vertical-align: top; }
th { background:#f3f4f6; font-weight:600; font-size:12px; color:#374151; }
tr:last-child td { border-bottom: none; }
td.st-ran { color:#2563eb; } td.st-cached { color:#059669; } td.st-failed { color:#dc2626; font-weight:600; }
td.st-skipped, td.st-not_run { color: var(--muted); }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
.plots { display:grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap:12px; }
.plots figure { margin:0; background:var(--card); border:1px solid var(--line); border-radius:8px; padding:8px; }
.plots img { width:100%; height:auto; display:block; }
dl.glossary { display:grid; grid-template-columns: 260px 1fr; gap:4px 16px; margin:0; }
dl.glossary dt { font-family: ui-monospace, Menlo, Consolas, monospace; font-size:12px; color:#374151; }
dl.glossary dd { margin:0; color:#374151; }
.error { background:#fef2f2; border:1px solid #fecaca; border-radius:8px; padding:10px 12px; color:#991b1b; }
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _html_table(section: Section) -> str:
    status_column = section.headers.index("status") if "status" in section.headers else -1
    head = "".join(f"<th>{_e(h)}</th>" for h in section.headers)
    body = []
    for row in section.rows:
        cells = []
        for i, cell in enumerate(row):
            css = f' class="st-{_e(cell)}"' if i == status_column else ""
            cells.append(f"<td{css}>{_e(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _cards(m: Metrics) -> str:
    cards = [
        ("AL (mean acceptance length)", fmt_num(m.mean_acceptance_length)),
        ("AR (draft acceptance rate)", fmt_pct(m.draft_acceptance_rate)),
        ("decode tokens/s", fmt_num(m.decode_tokens_per_s, 1)),
        ("end-to-end tokens/s", fmt_num(m.e2e_tokens_per_s, 1)),
        ("padded-slot fraction", fmt_pct(m.padded_slot_fraction)),
        ("TTFT median", fmt_s(m.ttft_median_s)),
    ]
    items = "".join(f'<div class="card"><div class="v">{_e(v)}</div><div class="k">{_e(k)}</div></div>' for k, v in cards)
    return f'<div class="cards">{items}</div>'


def render_html(report: RunReport, plots: list | None = None) -> str:
    """report.html: one self-contained page (inline CSS, plots as data:image/png URIs)."""
    name = report.recipe.get("name", report.run_id)
    parts = [
        f"<h1>spdflow run: {_e(name)}</h1>",
        f'<p><span class="status {_e(report.status)}">{_e(report.status.upper())}</span>'
        f'<span class="sub">{_e(status_line(report).split(" · ", 1)[1])}</span></p>',
    ]
    if report.error is not None:
        parts.append(f'<p class="error">{_e(report.error.stage or "run")}: {_e(report.error.message)}</p>')
    if report.metrics is not None:
        parts.append(_cards(report.metrics))
    for section in build_sections(report):
        parts.append(f"<h2>{_e(section.title)}</h2>")
        parts += [f"<p>{_e(line)}</p>" for line in section.lines]
        if section.headers and section.rows:
            parts.append(_html_table(section))
        if section.title == "Did it speed up?" and plots:
            parts.append(_html_plots(plots))
    if report.metrics is not None:
        parts.append(_html_glossary())
    body = "\n".join(parts)
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>spdflow · {_e(name)}</title>"
        f"<style>{_CSS}</style></head>\n<body><main>\n{body}\n</main></body></html>\n"
    )


def _html_plots(plots: list) -> str:
    figures = "".join(
        f'<figure><img alt="{_e(p.title)}" src="data:image/png;base64,{base64.b64encode(p.png).decode("ascii")}"></figure>'
        for p in plots
    )
    return f'<h2>Plots</h2><div class="plots">{figures}</div>'


def _html_glossary() -> str:
    items = "".join(f"<dt>{_e(name)}</dt><dd>{_e(text)}</dd>" for name, text in glossary().items())
    return f'<h2>Glossary: metric definitions</h2><dl class="glossary">{items}</dl>'


# ------------------------------------------------------------------------------------------
# files


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to a temp file next to ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def _with_metrics(report: RunReport, records: list[dict]) -> RunReport:
    # A report whose engine did not compute metrics (e.g. a run interrupted mid-generation)
    # still gets them from whatever the trace holds.
    if report.metrics is not None or not any(r.get("kind") in ("step", "request") for r in records):
        return report
    data = report.model_dump()
    data["metrics"] = compute_metrics(records).model_dump()
    return RunReport.model_validate(data)


def write_report_files(run_dir: Path, report: RunReport, records: list[dict]) -> dict[str, Path]:
    """Write report.json, report.md, report.html and plots/*.png into ``run_dir``.

    ``records`` are the trace records; they fill ``report.metrics`` when it is None.
    Returns name -> path: "json", "md", "html" and "plot:<name>" for each plot.
    """
    from spdflow.report.plots import render_plots

    run_dir = Path(run_dir)
    report = _with_metrics(report, records)
    report.paths.setdefault("report_json", "report.json")
    report.paths.setdefault("report_md", "report.md")
    report.paths.setdefault("report_html", "report.html")
    plots = render_plots(report.metrics) if report.metrics is not None else []
    written: dict[str, Path] = {}
    for plot in plots:
        written[f"plot:{plot.name}"] = write_atomic(run_dir / "plots" / f"{plot.name}.png", plot.png)
    plot_links = {p.title: f"plots/{p.name}.png" for p in plots}
    written["json"] = write_atomic(run_dir / "report.json", report.model_dump_json(indent=2) + "\n")
    written["md"] = write_atomic(run_dir / "report.md", render_markdown(report, plot_links))
    written["html"] = write_atomic(run_dir / "report.html", render_html(report, plots))
    return written


# ------------------------------------------------------------------------------------------
# terminal


def summary_table(report: RunReport):
    """A rich Table with the numbers a user wants after ``spdflow run``."""
    from rich.table import Table

    table = Table(title=f"spdflow · {status_line(report)}", show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value")
    m = report.metrics
    if m is None:
        table.add_row("metrics", "generation did not run")
    else:
        table.add_row("AL (mean acceptance length)", fmt_num(m.mean_acceptance_length))
        table.add_row("AR (draft acceptance rate)", fmt_pct(m.draft_acceptance_rate))
        table.add_row("decode throughput", f"{fmt_num(m.decode_tokens_per_s, 1)} tokens/s")
        table.add_row("end-to-end throughput", f"{fmt_num(m.e2e_tokens_per_s, 1)} tokens/s")
        table.add_row("K usage", fmt_k_usage(m))
        table.add_row("padded-slot fraction", fmt_pct(m.padded_slot_fraction))
        table.add_row(
            "time split",
            f"propose {fmt_pct(m.propose_fraction)} · verify {fmt_pct(m.verify_fraction)} · host {fmt_pct(m.host_fraction)}",
        )
        table.add_row("TTFT median / TPOT median", f"{fmt_s(m.ttft_median_s)} / {fmt_s(m.tpot_median_s)}")
        table.add_row("requests / tokens / wall", f"{m.requests} / {fmt_num(m.generated_tokens)} / {fmt_s(m.wall_s)}")
    table.add_row("lossless", lossless_verdict(report))
    if report.peak_rss_mb is not None:
        table.add_row("peak RSS", f"{report.peak_rss_mb:,.0f} MiB")
    return table
