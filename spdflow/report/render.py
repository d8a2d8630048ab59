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
from dataclasses import dataclass, field
from pathlib import Path

from spdflow.files import write_bytes_atomic, write_text_atomic
from spdflow.recipe.schema import REFERENCE_POLICY
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
    if "identity not expected" in (lossless.baseline or ""):
        return (f"differs from the no-spec sample in requests {ids}, as expected when sampling: rejection sampling "
                f"keeps the output distribution, not the exact tokens")
    return f"NOT lossless: differs from the greedy no-spec output in requests {ids} ({lossless.baseline or 'no-spec'})"


# ------------------------------------------------------------------------------------------
# the shared content


@dataclass
class Section:
    """One part of the report: a heading, some sentences, optionally a table."""

    title: str
    lines: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


def _settings(values: dict | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (values or {}).items())


def _named(value, default: str = "") -> str:
    """``name`` or ``name (k=v, ...)`` of a plain name or a ``{uses, with}`` block."""
    if isinstance(value, dict):
        name = str(value.get("uses", default))
        settings = _settings(value.get("with"))
        return f"{name} ({settings})" if settings else name
    return str(value) if value is not None else default


def recipe_lines(report: RunReport) -> list[tuple[str, str]]:
    """The effective recipe in a few (label, value) lines: what this run actually ran."""
    r = report.recipe
    if not r:
        return []
    model = r.get("model") or {}
    spec = r.get("specialization") or {}
    devices = r.get("devices") or {}
    work = r.get("workload") or {}
    proposer = r.get("proposer")
    ks = sorted(set(r.get("num_speculative_tokens") or [0]))
    batch = f"batch_size {spec.get('batch_size', 1)}"
    if spec.get("full_batch_size"):
        batch += f", continuous batching over {spec['full_batch_size']} slots"
    source = next((f"{k} {'(inline, ' + str(len(work[k])) + ')' if k == 'prompts' else work[k]}"
                   for k in ("builtin", "file", "prompts") if work.get(k) is not None), "?")
    if float(work.get("temperature", 0) or 0) == 0:
        sampling = "greedy (temperature 0)"
    else:
        sampling = f"temperature {work['temperature']}, top_k {work.get('top_k', 0)}, top_p {work.get('top_p', 1.0)}"
    sampling += f", seed {work.get('seed', 0)}" + (", ignore_eos" if work.get("ignore_eos") else "")
    backend_extra = devices.get("with") or {}  # the backend's own settings, when the recipe gives them
    lines = [
        ("model", f"{model.get('id', '?')} ({model.get('dtype', '?')})"),
        ("proposer", _named(proposer) if proposer else "none (no-spec)"),
        ("K-list", f"{ks}"),
        ("K policy", f"{_named(r.get('k_policy'), REFERENCE_POLICY)}; acceptance {r.get('acceptance', 'auto')}"),
        ("batch", batch),
        ("shapes", f"ctx_len {spec.get('ctx_len', '?')}, prefill_seq_len {spec.get('prefill_seq_len', '?')}"),
        ("backend", f"{devices.get('backend', '?')} on devices {devices.get('device_ids', [0])}"
                    + (f" ({_settings(backend_extra)})" if backend_extra else "")),
        ("workload", f"{source}: {work.get('count', '?')} prompts, max_new_tokens {work.get('max_new_tokens', '?')}"),
        ("sampling", sampling),
        ("--set", " ".join(report.overrides) if report.overrides else "none"),
        ("recipe hash", f"{(report.recipe_effective_sha256 or '?')[:16]} (effective recipe; file "
                        f"{report.recipe_path or '?'} sha256 {(report.recipe_sha256 or '?')[:12]})"),
    ]
    return lines


def _what_ran(report: RunReport) -> Section:
    return Section("What ran", [], ["setting", "value"], [[k, v] for k, v in recipe_lines(report)])


def speedup(report: RunReport) -> dict[str, float | None] | None:
    """This run over the no-spec baseline measured in the same process: tokens/s and TPOT ratios."""
    m, b = report.metrics, report.baseline
    if m is None or b is None:
        return None

    def ratio(a, c):
        return a / c if a is not None and c else None

    return {"decode_tokens_per_s": ratio(m.decode_tokens_per_s, b.decode_tokens_per_s),
            "e2e_tokens_per_s": ratio(m.e2e_tokens_per_s, b.e2e_tokens_per_s),
            "tpot_median": ratio(m.tpot_median_s, b.tpot_median_s)}


SPEEDUP_CAVEAT = ("one run each in this process, on the same compiled program and requests; the baseline ran "
                  "first and also warmed the session up, and a busy machine moves either figure by several per "
                  "cent — `spdflow bench` interleaves repeats and reports medians for a figure to quote")


def fmt_x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def error_text(report: RunReport) -> str:
    """``stage: message``, without repeating a stage the message already names."""
    error = report.error
    if error is None:
        return ""
    if error.stage and not error.message.startswith(f"{error.stage}:"):
        return f"{error.stage}: {error.message}"
    return error.message


def status_line(report: RunReport) -> str:
    """``ok · run tiny-varK-20260101T120000 · 12.31 s`` (plus the error when there is one)."""
    parts = [report.status.upper(), f"run {report.run_id}", fmt_s(report.duration_s)]
    if report.error is not None:
        parts.append(error_text(report))
    return " · ".join(parts)


def speed_sentence(m: Metrics, report: RunReport | None = None) -> str:
    """A plain-language reading of the speculation numbers, with the measured speed-up when a
    no-spec baseline ran in the same process."""
    if not m.decode_steps:
        return "No decode step ran."
    ratios = speedup(report) if report is not None else None
    if ratios is not None and ratios["decode_tokens_per_s"] is not None:
        b = report.baseline
        verdict = "faster" if ratios["decode_tokens_per_s"] > 1 else "slower"
        compared = (f"Measured against no-spec: decode ran at {fmt_num(m.decode_tokens_per_s, 1)} tokens/s vs "
                    f"{fmt_num(b.decode_tokens_per_s, 1)} without speculation — {fmt_x(ratios['decode_tokens_per_s'])} "
                    f"({verdict}); median time per output token {fmt_s(m.tpot_median_s)} vs {fmt_s(b.tpot_median_s)} "
                    f"({fmt_x(ratios['tpot_median'])}). Caveat: {SPEEDUP_CAVEAT}.")
    elif report is not None and report.lossless is not None and "this run is the no-spec baseline" in report.lossless.baseline:
        compared = "This run is the no-spec baseline (speed-up 1.00× by definition)."
    else:
        compared = ("No no-spec baseline ran in this process: rerun with --baseline (or --check-lossless) for the "
                    "measured speed-up, or use spdflow bench.")
    if not m.proposed_tokens:
        return (f"No speculation: {m.decode_steps} decode steps each produced one token per request "
                f"(AL 1.00); decode ran at {fmt_num(m.decode_tokens_per_s, 1)} tokens/s. {compared}")
    extra = (m.mean_acceptance_length or 1.0) - 1.0
    return (
        f"Each decode step gained {fmt_num(extra)} extra tokens per request on average over plain decoding "
        f"(AL {fmt_num(m.mean_acceptance_length)} tokens per step; 1.00 means no gain), with "
        f"{fmt_pct(m.draft_acceptance_rate)} of drafts accepted; {fmt_pct(m.padded_slot_fraction)} of verified "
        f"positions held no proposal. {compared}"
    )


def _headline(m: Metrics, report: RunReport) -> Section:
    rows = []
    ratios = speedup(report)
    if ratios is not None:
        b = report.baseline
        rows += [
            ["Speed-up: decode tokens/s vs no-spec", f"{fmt_x(ratios['decode_tokens_per_s'])} "
             f"({fmt_num(m.decode_tokens_per_s, 1)} vs {fmt_num(b.decode_tokens_per_s, 1)})"],
            ["Speed-up: end-to-end tokens/s vs no-spec", f"{fmt_x(ratios['e2e_tokens_per_s'])} "
             f"({fmt_num(m.e2e_tokens_per_s, 1)} vs {fmt_num(b.e2e_tokens_per_s, 1)})"],
            ["TPOT median vs no-spec (lower is better)", f"{fmt_x(ratios['tpot_median'])} "
             f"({fmt_s(m.tpot_median_s)} vs {fmt_s(b.tpot_median_s)})"],
        ]
    rows += [
        ["Mean acceptance length (AL, every step)", fmt_num(m.mean_acceptance_length)],
        ["AL over steps with a proposal (vLLM's definition)", fmt_num(m.mean_acceptance_length_drafted)],
        ["Draft acceptance rate (AR)", fmt_pct(m.draft_acceptance_rate)],
        ["Decode throughput", f"{fmt_num(m.decode_tokens_per_s, 1)} tokens/s"],
        ["End-to-end throughput", f"{fmt_num(m.e2e_tokens_per_s, 1)} tokens/s"],
        ["K usage", fmt_k_usage(m)],
        ["Padded-slot fraction", fmt_pct(m.padded_slot_fraction)],
        ["TTFT mean / median / p90 (includes queueing)",
         " / ".join(fmt_s(v) for v in (m.ttft_mean_s, m.ttft_median_s, m.ttft_p90_s))],
        ["TPOT mean / median", " / ".join(fmt_s(v) for v in (m.tpot_mean_s, m.tpot_median_s))],
        ["Requests / generated tokens", f"{m.requests} / {fmt_num(m.generated_tokens)}"],
        ["Generation wall time", fmt_s(m.wall_s)],
        ["Lossless", lossless_verdict(report)],
    ]
    if report.peak_rss_mb is not None:
        rows.append(["Peak RSS", f"{report.peak_rss_mb:,.0f} MiB"])
    lines = [speed_sentence(m, report),
             "AL counts every decode step, including steps where nothing was proposed (those gain 1 token); vLLM's "
             "mean acceptance length counts only steps with a proposal, so compare that row with vLLM figures."]
    return Section("Did it speed up?", lines, ["metric", "value"], rows)


def _step_costs(m: Metrics, report: RunReport) -> Section:
    baseline = report.baseline.step_costs if report.baseline is not None else []
    k0 = {c.batch: c.verify_median_s for c in m.step_costs if c.k == 0}
    k0.update({c.batch: c.verify_median_s for c in baseline if c.k == 0})  # the baseline ran K=0 far more often
    rows = [["0 (no-spec baseline)", str(c.batch), str(c.steps), fmt_s(c.verify_median_s), fmt_s(c.verify_p90_s), "1.00×"]
            for c in baseline if c.k == 0]
    rows += [[str(c.k), str(c.batch), str(c.steps), fmt_s(c.verify_median_s), fmt_s(c.verify_p90_s),
              fmt_x(c.verify_median_s / k0[c.batch]) if k0.get(c.batch) else "—"] for c in m.step_costs]
    for timed in report.timed_costs:
        zero = timed.verify_s.get(0)
        rows += [[f"{k} (timed)", str(timed.batch), "—", fmt_s(v), "—", fmt_x(v / zero) if zero else "—"]
                 for k, v in sorted(timed.verify_s.items())]
    lines = ["Measured verify time of the decode steps that ran, per K and batch rows; rows marked (timed) are "
             "every compiled K run in blocks of one K after generation (cost_grid.json), so K never switches "
             "there. Speculating K tokens pays when the tokens a step gains (AL) grow faster than its cost "
             "relative to K=0."]
    switches = [f"batch {t.batch}: {fmt_s(t.switch_s)}" for t in report.timed_costs if t.switch_s is not None]
    if switches:
        lines.append("Extra time of the first step after a change of K: " + ", ".join(switches) + ".")
    return Section("Step cost per K", lines, ["K", "batch", "steps", "verify median", "verify p90", "vs K=0"], rows)


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


def _oracle(report: RunReport) -> Section:
    """The oracle beside this run's policy and the static choices, all priced alike."""
    o = report.oracle
    if not o.computed:
        return Section("Oracle", [f"Not computed: {o.reason}."])
    m = report.metrics
    steps = o.oracle_steps or 0
    usage = " · ".join(f"K{k}: {fmt_pct(n / steps)}" for k, n in sorted(o.oracle_k_usage.items())) if steps else "—"
    lines = [
        f"{o.label} at batch {o.batch_size}: {fmt_num(o.oracle_tokens_per_s, 1)} tokens/s priced, {steps} steps "
        f"({usage}). This run's steps priced alike: {fmt_num(o.policy_priced_tokens_per_s, 1)} tokens/s "
        f"(measured {fmt_num(m.e2e_tokens_per_s if m else None, 1)}): policy efficiency "
        f"{fmt_num(o.policy_efficiency, 3)}, regret {_signed_pct(o.regret_vs_best_static)} against the best static "
        f"choice ({o.best_static}, {fmt_num(o.best_static_tokens_per_s, 1)} tokens/s priced).",
        "Priced by this run's measured step costs: verify time per K "
        + ", ".join(f"K{k} {v} ms ({(o.cost.get('sources') or {}).get(k, '?')})"
                    for k, v in (o.cost.get("verify_ms") or {}).items())
        + f", switch {o.cost.get('switch_ms', '—')} ms; host and proposer time per step the run's mean, alike for "
        "every schedule (the policy's own overhead is in its measured tokens/s). Computed after "
        f"generation in {fmt_s(o.seconds)}, outside the run's tokens/s.",
    ]
    if not o.exact:
        lines.append(f"The search kept {o.beam_width} states per step and did not prove this schedule the fastest: "
                     "it is the best found, a lower bound on the best possible speed, so efficiency may exceed 1.")
    rows = [[o.label, fmt_num(o.oracle_tokens_per_s, 1), "1.000"],
            ["this run's policy", fmt_num(o.policy_priced_tokens_per_s, 1), fmt_num(o.policy_efficiency, 3)]]
    statics = ([("no-spec", o.nospec_priced_tokens_per_s)] if o.nospec_priced_tokens_per_s is not None else [])
    statics += [(f"fixed K={k}", v) for k, v in sorted(o.fixed_priced_tokens_per_s.items())]
    rows += [[name, fmt_num(v, 1), fmt_num(v / o.oracle_tokens_per_s, 3) if o.oracle_tokens_per_s else "—"]
             for name, v in statics]
    return Section("Oracle", lines, ["schedule", "tokens/s (priced)", "vs oracle"], rows)


def _signed_pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f}%"


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


def _no_metrics_reason(report: RunReport) -> str:
    generate = next((st for st in report.stages if st.name == "generate"), None)
    if generate is not None and generate.status == "skipped":
        return f"Generation was skipped ({generate.reason}), so there is nothing to compare yet."
    if report.status != "ok":
        return "Generation did not finish, so there are no metrics: see the error above."
    return "Generation did not run: no metrics."


def build_sections(report: RunReport) -> list[Section]:
    """The report's content, in reading order, shared by report.md and report.html."""
    sections = []
    m = report.metrics
    if report.recipe:
        sections.append(_what_ran(report))
    if m is not None:
        sections += [_headline(m, report), _speculation(m)]
        if report.oracle is not None:
            sections.append(_oracle(report))
        if m.step_costs:
            sections.append(_step_costs(m, report))
        sections.append(_time_split(m))
    else:
        sections.append(Section("Did it speed up?", [_no_metrics_reason(report)]))
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


def _cards(m: Metrics, report: RunReport) -> str:
    ratios = speedup(report)
    cards = []
    if ratios is not None:
        cards.append(("speed-up vs no-spec (decode tokens/s, one run each)", fmt_x(ratios["decode_tokens_per_s"])))
    cards += [
        ("AL per step with a proposal (vLLM's AL)", fmt_num(m.mean_acceptance_length_drafted)),
        ("AL over every step (no-proposal steps count 1)", fmt_num(m.mean_acceptance_length)),
        ("AR (draft acceptance rate)", fmt_pct(m.draft_acceptance_rate)),
        ("decode tokens/s", fmt_num(m.decode_tokens_per_s, 1)),
        ("end-to-end tokens/s", fmt_num(m.e2e_tokens_per_s, 1)),
        ("padded-slot fraction", fmt_pct(m.padded_slot_fraction)),
        ("TTFT median (includes queueing)", fmt_s(m.ttft_median_s)),
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
        parts.append(f'<p class="error">{_e(error_text(report))}</p>')
    if report.metrics is not None:
        parts.append(_cards(report.metrics, report))
    placed = {"Step cost per K": [p for p in plots or [] if p.name == "step_cost"]}
    placed["Did it speed up?"] = [p for p in plots or [] if p.name != "step_cost"]
    for section in build_sections(report):
        parts.append(f"<h2>{_e(section.title)}</h2>")
        parts += [f"<p>{_e(line)}</p>" for line in section.lines]
        if section.headers and section.rows:
            parts.append(_html_table(section))
        if placed.get(section.title):
            parts.append(_html_plots(placed[section.title], heading=section.title == "Did it speed up?"))
    if report.metrics is not None:
        parts.append(_html_glossary())
    body = "\n".join(parts)
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>spdflow · {_e(name)}</title>"
        f"<style>{_CSS}</style></head>\n<body><main>\n{body}\n</main></body></html>\n"
    )


def _html_plots(plots: list, heading: bool = True) -> str:
    figures = "".join(
        f'<figure><img alt="{_e(p.title)}" src="data:image/png;base64,{base64.b64encode(p.png).decode("ascii")}"></figure>'
        for p in plots
    )
    return ('<h2>Plots</h2>' if heading else "") + f'<div class="plots">{figures}</div>'


def _html_glossary() -> str:
    items = "".join(f"<dt>{_e(name)}</dt><dd>{_e(text)}</dd>" for name, text in glossary().items())
    return f'<h2>Glossary: metric definitions</h2><dl class="glossary">{items}</dl>'


# ------------------------------------------------------------------------------------------
# files


def _write(path: Path, data: bytes | str) -> Path:
    if isinstance(data, bytes):
        return write_bytes_atomic(path, data)
    return write_text_atomic(path, data)


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
        written[f"plot:{plot.name}"] = _write(run_dir / "plots" / f"{plot.name}.png", plot.png)
    plot_links = {p.title: f"plots/{p.name}.png" for p in plots}
    written["json"] = _write(run_dir / "report.json", report.model_dump_json(indent=2) + "\n")
    written["md"] = _write(run_dir / "report.md", render_markdown(report, plot_links))
    written["html"] = _write(run_dir / "report.html", render_html(report, plots))
    return written


# ------------------------------------------------------------------------------------------
# terminal


def summary_table(report: RunReport):
    """A rich Table with what ran and the numbers a user wants after ``spdflow run``."""
    from rich.table import Table

    table = Table(title=f"spdflow · {status_line(report)}", show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value")
    for label, value in recipe_lines(report):
        if label in ("model", "proposer", "K-list", "K policy", "batch", "backend", "workload", "--set", "recipe hash"):
            table.add_row(label, value)
    m = report.metrics
    if m is None:
        table.add_row("metrics", _no_metrics_reason(report))
    else:
        ratios = speedup(report)
        if ratios is not None:
            table.add_row("speed-up vs no-spec", f"{fmt_x(ratios['decode_tokens_per_s'])} decode tokens/s, "
                          f"{fmt_x(ratios['tpot_median'])} TPOT (one run each, this process; bench for medians)")
        table.add_row("AL (every step / vLLM's)", f"{fmt_num(m.mean_acceptance_length)} / {fmt_num(m.mean_acceptance_length_drafted)}")
        table.add_row("AR (draft acceptance rate)", fmt_pct(m.draft_acceptance_rate))
        table.add_row("decode throughput", f"{fmt_num(m.decode_tokens_per_s, 1)} tokens/s")
        table.add_row("end-to-end throughput", f"{fmt_num(m.e2e_tokens_per_s, 1)} tokens/s")
        table.add_row("K usage", fmt_k_usage(m))
        table.add_row("padded-slot fraction", fmt_pct(m.padded_slot_fraction))
        table.add_row(
            "time split",
            f"propose {fmt_pct(m.propose_fraction)} · verify {fmt_pct(m.verify_fraction)} · host {fmt_pct(m.host_fraction)}",
        )
        table.add_row("TTFT median (with queueing) / TPOT median", f"{fmt_s(m.ttft_median_s)} / {fmt_s(m.tpot_median_s)}")
        table.add_row("requests / tokens / wall", f"{m.requests} / {fmt_num(m.generated_tokens)} / {fmt_s(m.wall_s)}")
    table.add_row("lossless", lossless_verdict(report))
    if report.peak_rss_mb is not None:
        table.add_row("peak RSS", f"{report.peak_rss_mb:,.0f} MiB")
    return table
