"""Issue 23's K-policy tables: every policy against no-spec and the best fixed K, per workload and batch.

For each workload (a recipe plus ``--set`` overrides) one ``spdflow bench`` runs, under
``nice -n -20``, at batch sizes 1,2,4,8 with the modes ``nospec``, ``fixed:all`` (fixed K at every
K > 0 of the K-list) and each K policy: ``goodput`` and ``smallest_covering`` always, plus any
named with ``--policies``. Its rows (``<out>/<workload>.json``) give one markdown table per
workload × batch size: no-spec, each fixed K (the best marked), each policy's tokens/s with its
ratio to max(no-spec, best fixed K) and whether it reaches the issue's 0.97 line; the oracle,
policy efficiency and regret too when the bench rows carry them (priced by ``spdflow.oracle``'s
cost model, not measured; ``*``: a beam search's best found, not proven best). ``uptime`` is recorded before
and after each workload, and the wall time each took. Workloads some K-policy parameter was
tuned on and the evaluation-only ones (``spdflow_workloads.EVALUATION_ONLY``) get separate sections.

    python benchmarks/k_policy_tables.py --repeats 3                       # embedded-model workloads
    python benchmarks/k_policy_tables.py --repeats 3 --policies guarded \\
        --update-readme benchmarks/README.md                               # re-run, README section replaced
    python benchmarks/k_policy_tables.py --render-only --out DIR          # tables again from DIR's JSON

Each bench's own order of modes and repeats is interleaved (spdflow bench rotates it), so the
ratios inside one table are measured side by side; tables of different workloads ran at
different times: compare their ratios, not their absolute tokens/s.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
#: Policies every table has; --policies adds more.
DEFAULT_POLICIES = ("goodput", "smallest_covering")
BATCH_SIZES = "1,2,4,8"
#: The issue's line: a policy must reach this share of max(no-spec, best fixed K).
LINE = 0.97
#: coverage of the interval around the paired median (:func:`median_interval`)
CI_LEVEL = 0.9
TUNED, HELD_OUT = "tuned on", "held out"
README_BEGIN = "<!-- k_policy_tables: begin (benchmarks/k_policy_tables.py --update-readme writes this) -->"
README_END = "<!-- k_policy_tables: end -->"


@dataclass(frozen=True)
class Workload:
    """One bench invocation: recipe, overrides, and whether any policy was tuned on it."""

    name: str
    recipe: str
    overrides: tuple[str, ...] = ()
    section: str = TUNED
    about: str = ""
    extra_args: tuple[str, ...] = field(default=())
    embedded: bool = True  # the embedded zoo model (no download, no extra model to make)


def _synthetic(rate: float) -> Workload:
    return Workload(f"synthetic_{rate}", "recipes/tinycode_varK.yaml",
                    (f"proposer={{uses: synthetic, with: {{acceptance_rate: {rate}}}}}",),
                    about=f"code prompts, synthetic proposer at acceptance {rate}")


def _synthetic_50m(rate: float) -> Workload:
    return Workload(f"synthetic50m_{rate}", "recipes/bench_50m_synthetic.yaml", (f"proposer.with.acceptance_rate={rate}",),
                    about=f"~52M random Llama (python benchmarks/make_50m_model.py first), synthetic at {rate}",
                    extra_args=("--allow-outside-paths",), embedded=False)


WORKLOADS = {w.name: w for w in [
    Workload("code", "recipes/tinycode_varK.yaml", about="held-out stdlib function openings, prompt lookup"),
    Workload("rare", "recipes/tinycode_rare.yaml", ("workload.temperature=0",),
             about="lines of distinct English words, prompt lookup, temperature 0"),
    _synthetic(0.3), _synthetic(0.6), _synthetic(0.9),
    Workload("stdlib_tests", "recipes/tinycode_varK.yaml", ("workload.builtin=stdlib_tests",), HELD_OUT,
             about="function openings from the held-out stdlib test modules, prompt lookup"),
    Workload("thirdparty", "recipes/tinycode_varK.yaml", ("workload.builtin=thirdparty",), HELD_OUT,
             about="function openings from click, pluggy and PyYAML, prompt lookup"),
    Workload("edit", "recipes/smollm2_chat_varK.yaml", (), about="SmolLM2-135M-Instruct (extra smollm2), edit chats",
             embedded=False),
    _synthetic_50m(0.3), _synthetic_50m(0.6), _synthetic_50m(0.9),
]}
#: What runs without --workloads: the embedded-model workloads.
DEFAULT_WORKLOADS = tuple(name for name, w in WORKLOADS.items() if w.embedded)


# ------------------------------------------------------------------------------ running


def uptime() -> str:
    """The load averages now (``uptime``'s tail)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + " ".join(open("/proc/loadavg").read().split()[:3])


def bench_command(workload: Workload, policies: list[str], repeats: int, count: int, json_path: Path,
                  batch_sizes: str = BATCH_SIZES, overrides: Sequence[str] = ()) -> list[str]:
    """The ``spdflow bench`` command line for one workload (under ``nice -n -20``); ``overrides``
    (``--set`` of this script) come after the workload's own."""
    modes = ",".join(["nospec", "fixed:all", *policies])
    command = ["nice", "-n", "-20", sys.executable, "-m", "spdflow", "bench", workload.recipe, "--batch-sizes", batch_sizes,
               "--modes", modes, "--repeats", str(repeats), "--json", str(json_path), "--markdown",
               "--set", f"workload.count={count}", *workload.extra_args]
    for override in [*workload.overrides, *overrides]:
        command += ["--set", override]
    return command


def run_workload(workload: Workload, policies: list[str], args, out: Path) -> dict:
    """One bench; returns its record (command, load before/after, seconds, exit code)."""
    json_path = out / f"{workload.name}.json"
    command = bench_command(workload, policies, args.repeats, args.count, json_path, args.batch_sizes, args.overrides)
    shown = [c if c != sys.executable else "python" for c in command]
    shown = [_relative(c) for c in shown]
    record = {"workload": workload.name, "command": " ".join(_quote(c) for c in shown), "uptime_before": uptime()}
    print(f"== {workload.name}: {record['command']}", file=sys.stderr, flush=True)
    start = time.monotonic()
    with open(out / f"{workload.name}.md", "w") as stdout, open(out / f"{workload.name}.log", "w") as stderr:
        code = subprocess.run(command, cwd=REPO, stdout=stdout, stderr=stderr).returncode
    record.update(seconds=round(time.monotonic() - start, 1), uptime_after=uptime(), exit_code=code)
    print(f"   {workload.name}: exit {code} after {record['seconds']} s; {record['uptime_after']}", file=sys.stderr, flush=True)
    return record


def _relative(text: str) -> str:
    """A path inside the repository as the README shows it: relative to the repository."""
    return text.removeprefix(str(REPO) + os.sep)


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


# ------------------------------------------------------------------------------ the tables


def _first(row: dict, *keys):
    """The first of ``keys`` the row has a number for (the oracle columns' names may vary)."""
    for key in keys:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


def _fmt(value, spec=".0f") -> str:
    return "—" if value is None else format(value, spec)


def _spread(row: dict) -> str:
    return f"{_fmt(row.get('tokens_per_s'))} ({_fmt(row.get('tokens_per_s_min'))}–{_fmt(row.get('tokens_per_s_max'))})"


def batch_table(rows: list[dict], policies: list[str]) -> tuple[list[str], dict[str, bool | None]]:
    """The markdown lines of one workload × batch table, and per policy whether it reached the line."""
    nospec = next((r for r in rows if r.get("role") == "baseline" or r.get("mode") == "nospec"), None)
    fixed = sorted((r for r in rows if str(r.get("mode", "")).startswith("fixed:")), key=lambda r: r.get("fixed_k") or 0)
    best = max(fixed, key=lambda r: r.get("tokens_per_s") or 0, default=None)
    static = max([r.get("tokens_per_s") or 0 for r in [nospec, best] if r is not None], default=0)
    has_oracle = any(_first(r, "oracle_tokens_per_s") is not None for r in rows)
    has_efficiency = any(_first(r, "policy_efficiency", "efficiency") is not None for r in rows)
    has_regret = any(_first(r, "regret_vs_best_static") is not None for r in rows)
    # The static choice of the measured verdict, for the paired one: its repeats beside the policy's.
    reference = max([r for r in [nospec, best] if r is not None], key=lambda r: r.get("tokens_per_s") or 0, default=None)
    has_paired = reference is not None and bool(reference.get("tokens_per_s_by_repeat"))
    header = ["mode", "tok/s (min–max)", "÷ max(no-spec, best fixed)", f"≥ {LINE}"]
    header += ["paired ÷ (q1–q3)", f"paired ≥ {LINE}", f"paired {CI_LEVEL:.0%} CI"] * has_paired + ["AL"]
    header += ["oracle tok/s (priced)"] * has_oracle + ["efficiency"] * has_efficiency + ["regret (priced)"] * has_regret
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    reached: dict[str, bool | None] = {}
    paired_reached: dict[str, bool | None] = {}
    not_below: dict[str, bool | None] = {}  # False: the paired interval lies wholly below the line

    def mark_of(ok: bool | None) -> str:
        return "—" if ok is None else ("reached" if ok else "**not reached**")

    def line(label: str, row: dict | None, mark: bool) -> None:
        if row is None:
            return
        tps = row.get("tokens_per_s")
        ratio = tps / static if tps and static else None
        verdict = "—"
        if mark:
            reached[label] = None if ratio is None else ratio >= LINE
            verdict = mark_of(reached[label])
        cells = [label, _spread(row), _fmt(ratio, ".3f"), verdict]
        if has_paired:
            ratios = paired_ratios(row, reference)
            middle = statistics.median(ratios) if ratios else None
            spread = "" if len(ratios) < 2 else f" ({_quartiles(ratios)})"
            cells.append(_fmt(middle, ".3f") + spread)
            interval = median_interval(ratios)
            if mark:
                paired_reached[label] = None if middle is None else middle >= LINE
                not_below[label] = None if interval is None else interval[1] >= LINE
            cells.append(mark_of(paired_reached[label]) if mark else "—")
            shown_interval = "—" if interval is None else f"{interval[0]:.3f}–{interval[1]:.3f}"
            cells.append(f"**{shown_interval}**" if mark and not_below[label] is False else shown_interval)
        cells.append(_fmt(row.get("al"), ".2f"))
        oracle = _fmt(_first(row, "oracle_tokens_per_s"))
        cells += [oracle + ("*" if row.get("oracle_exact") is False else "")] * has_oracle
        cells += [_fmt(_first(row, "policy_efficiency", "efficiency"), ".3f")] * has_efficiency
        regret = _first(row, "regret_vs_best_static")
        cells += ["—" if regret is None else f"{regret * 100:+.1f} %"] * has_regret
        lines.append("| " + " | ".join(cells) + " |")

    line("no-spec", nospec, False)
    for row in fixed:
        line(f"fixed K={row.get('fixed_k')}" + (" (best fixed)" if row is best else ""), row, False)
    for policy in policies:
        row = next((r for r in rows if r.get("mode") in (f"varK:{policy}", policy)), None)
        if row is None:
            lines.append(f"| {policy} | not in the bench rows | — | — | — |"
                         + " — |" * (3 * has_paired + has_oracle + has_efficiency + has_regret))
            reached[policy] = None
            if has_paired:
                paired_reached[policy] = not_below[policy] = None
        else:
            line(policy, row, True)
    for row in rows:  # an oracle the bench reports as a row of its own
        if str(row.get("mode", "")).startswith("oracle"):
            line(row["mode"], row, False)
    if has_paired:
        reached["paired"], reached["paired_ci"] = paired_reached, not_below
    return lines, reached


def paired_ratios(row: dict, reference: dict) -> list[float]:
    """Per repeat, the row's tok/s over the reference's in the same repeat. A bench runs every
    mode once per repeat, back to back in a rotated order, so a ratio within a repeat leaves
    out the drift of the machine between repeats that a ratio of two medians keeps. Lists of
    different lengths cannot be paired by position: no ratios (no paired verdict)."""
    mine, theirs = row.get("tokens_per_s_by_repeat") or [], reference.get("tokens_per_s_by_repeat") or []
    if len(mine) != len(theirs):
        return []
    return [a / b for a, b in zip(mine, theirs) if a and b]


def median_interval(values: Sequence[float], level: float = CI_LEVEL) -> tuple[float, float] | None:
    """A distribution-free interval for the median of what the values are drawn from (here, the
    ratio of two modes run side by side in a repeat): the j-th smallest and the j-th largest value,
    for the largest j whose coverage, 1 - 2 P(Binomial(n, 1/2) < j), is at least ``level``. It
    assumes only that the repeats are independent draws. None when even the smallest and largest
    of n values cover less (n < 5 at 0.9). With 7 repeats it is the whole range; with 11, the 3rd
    to the 9th value (93 %)."""
    ordered, n = sorted(values), len(values)
    rank = 0
    for j in range(1, n // 2 + 1):
        if 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2 ** n < level:
            break
        rank = j
    return (ordered[rank - 1], ordered[n - rank]) if rank else None


def _quartiles(values: list[float]) -> str:
    low, _, high = statistics.quantiles(values, n=4, method="inclusive")
    return f"{low:.3f}–{high:.3f}"


def priced_verdicts(rows: list[dict], policies: list[str]) -> dict[str, bool | None]:
    """Per policy, whether its priced rate reaches the line against the best static choice priced
    alike (``1 + regret_vs_best_static``): the bench's oracle cost model prices the policy's own
    steps and every static choice by the same per-K step costs, so timing noise between modes
    (interleaved runs of identical decisions differ by up to ±15 % at load 2) does not enter."""
    out: dict[str, bool | None] = {}
    for policy in policies:
        row = next((r for r in rows if r.get("mode") in (f"varK:{policy}", policy)), None)
        regret = None if row is None else _first(row, "regret_vs_best_static")
        out[policy] = None if regret is None else 1.0 + regret >= LINE
    return out


def workload_section(workload: Workload, rows: list[dict], policies: list[str], record: dict | None) -> tuple[list[str], dict]:
    """A workload's heading, its run facts and one table per batch size; and the verdicts
    (per batch: the measured ones, and the priced ones under the key ``"priced"``)."""
    lines = [f"#### {workload.name}: {workload.about}", ""]
    if record:
        lines += [f"`{record['command']}`  ", f"{record['seconds']} s; load before: {_load(record['uptime_before'])}, "
                  f"after: {_load(record['uptime_after'])}" + ("" if record.get("exit_code") == 0 else
                                                              f"; **bench exit code {record.get('exit_code')}**"), ""]
    digests = sorted({r["prompts_sha256"][:12] for r in rows if r.get("prompts_sha256")})
    if digests:
        lines += [f"prompts sha256 {', '.join(digests)}…", ""]
    verdicts = {}
    for batch in sorted({r["batch_size"] for r in rows}):
        mine = [r for r in rows if r["batch_size"] == batch]
        table, reached = batch_table(mine, policies)
        same = all(r.get("identical_to_nospec") is not False for r in mine)
        lines += [f"batch {batch}" + ("" if same else " — **some mode's tokens differ from no-spec**") + ":", "", *table, ""]
        verdicts[batch] = {**reached, "priced": priced_verdicts(mine, policies)}
    return lines, verdicts


def _load(text: str) -> str:
    return text.split("load average:")[-1].strip()


def summary_table(verdicts: dict[str, dict], policies: list[str]) -> list[str]:
    """Per workload and policy, the batch sizes where the policy missed the 0.97 line: measured
    (median tok/s), paired (median of the per-repeat ratios, when the rows carry each repeat), the
    paired misses the repeats settle (the median's interval, :func:`median_interval`, lies wholly
    below the line) and priced (the oracle's cost model, when the rows carry it)."""
    paired = any("paired" in reached for by_batch in verdicts.values() for reached in by_batch.values())
    kinds = [None, "paired", "paired_ci", "priced"] if paired else [None, "priced"]
    titles = {None: f"below {LINE}, measured", "paired": "paired", "paired_ci": f"paired {CI_LEVEL:.0%} CI wholly below",
              "priced": "priced"}
    lines = ["| workload | " + " | ".join(f"{p}: {titles[kind]}" for p in policies for kind in kinds) + " |",
             "|" + "---|" * (len(kinds) * len(policies) + 1)]

    def below(by_batch: dict, policy: str, kind: str | None) -> str:
        got = {b: (reached.get(kind, {}) if kind else reached).get(policy) for b, reached in by_batch.items()}
        missed = [str(b) for b, ok in got.items() if ok is False]
        unknown = [str(b) for b, ok in got.items() if ok is None]
        if kind and len(unknown) == len(got):
            return "—"
        return (", ".join(missed) or "none") + (f" (no figure at {', '.join(unknown)})" if unknown else "")

    for name, by_batch in verdicts.items():
        cells = [below(by_batch, p, kind) for p in policies for kind in kinds]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (no machine paths in tables)."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def render(out: Path, names: list[str], policies: list[str], records: dict[str, dict]) -> str:
    """The markdown of every table, tuned-on workloads first, then the held-out ones."""
    sections: dict[str, list[str]] = {TUNED: [], HELD_OUT: []}
    verdicts: dict[str, dict] = {}
    for name in names:
        workload = WORKLOADS[name]
        path = out / f"{name}.json"
        if not path.exists():
            sections[workload.section] += [f"#### {name}: no results ({shown(path)} missing)", ""]
            continue
        lines, verdicts[name] = workload_section(workload, json.loads(path.read_text()), policies, records.get(name))
        sections[workload.section] += lines
    text = [f"Policies: {', '.join(policies)}. A cell reaches the line when the policy's median tok/s ≥ {LINE} × "
            "max(no-spec, best fixed K) of the same bench and batch size; paired: when the median over repeats of "
            f"its tok/s ÷ that static choice's in the same repeat is ≥ the line; paired {CI_LEVEL:.0%} CI: a "
            "distribution-free interval for that median (order statistics of the per-repeat ratios; none under 5 "
            "repeats), and a miss counts as settled when the whole interval is below the line.", "",
            "Batch sizes where a policy is below the line:", "", *summary_table(verdicts, policies), ""]
    for section, title in ((TUNED, "Tuned on (K-policy parameters were fitted on these kinds)"),
                           (HELD_OUT, "Held out (evaluation only: nothing was fitted on them)")):
        if sections[section]:
            text += [f"### {title}", "", *sections[section]]
    return "\n".join(text).rstrip() + "\n"


def update_readme(readme: Path, tables: str) -> None:
    """Replace the text between the k_policy_tables markers of ``readme`` with ``tables``."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise SystemExit(f"{readme} has no k_policy_tables markers; add the lines\n{README_BEGIN}\n{README_END}\n"
                         "where the tables go")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_BEGIN}\n{tables}{README_END}{tail}")


# ------------------------------------------------------------------------------ main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help=f"comma-separated, of: {', '.join(WORKLOADS)} (default: the embedded-model ones)")
    parser.add_argument("--policies", default="", help="K policies to run beside " + " and ".join(DEFAULT_POLICIES))
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode (interleaved; default 3)")
    parser.add_argument("--count", type=int, default=24, help="prompts per workload (default 24)")
    parser.add_argument("--batch-sizes", default=BATCH_SIZES,
                        help=f"comma-separated batch sizes of every bench (default {BATCH_SIZES}; e.g. 1,2,4 for the "
                             "slow real-model workload)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "k_policy",
                        help="directory for the JSON, logs and tables.md")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override for every bench, after the workload's own (repeatable; e.g. "
                             "devices.with.session_mode=dynamic)")
    parser.add_argument("--render-only", action="store_true", help="no bench: the tables from --out's JSON")
    parser.add_argument("--update-readme", type=Path, metavar="README",
                        help="also replace the tables between the k_policy_tables markers of this file")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"unknown workload '{unknown[0]}': choose from {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    policies = list(DEFAULT_POLICIES) + [p.strip() for p in args.policies.split(",")
                                         if p.strip() and p.strip() not in DEFAULT_POLICIES]
    from spdflow.plugins import get_plugin_manager

    known = set(get_plugin_manager().registry()["k_policy"])
    missing = [p for p in policies if p not in known]
    if missing:
        print(f"unknown K policy '{missing[0]}': registered are {', '.join(sorted(known))}", file=sys.stderr)
        return 2
    if args.repeats < 1 or args.count < 1:
        print("--repeats and --count must be at least 1", file=sys.stderr)
        return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.json"
    records = {r["workload"]: r for r in json.loads(runs_path.read_text())} if runs_path.exists() else {}
    failed = []
    if not args.render_only:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        for name in names:
            records[name] = run_workload(WORKLOADS[name], policies, args, out)
            runs_path.write_text(json.dumps(list(records.values()), indent=1))
            if records[name]["exit_code"] != 0:
                failed.append(name)
                print(f"   {name} failed: see {out / (name + '.log')}", file=sys.stderr)
    tables = render(out, names, policies, records)
    (out / "tables.md").write_text(tables)
    print(tables)
    if args.update_readme is not None:
        update_readme(args.update_readme, tables)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
