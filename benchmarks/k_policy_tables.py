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
    python benchmarks/k_policy_tables.py --repeats 3 --policies my_policy \\
        --update-readme benchmarks/README.md                               # re-run, README section replaced
    python benchmarks/k_policy_tables.py --repeats 5 --processes 3       # 3 benches per workload, pooled
    python benchmarks/k_policy_tables.py --repeats 5 --processes 2 --first-process 4 --out DIR
                                                                          # 2 more, pooled with DIR's p1-p3
    python benchmarks/k_policy_tables.py --render-only --out DIR          # tables again from DIR's JSON
    python benchmarks/k_policy_tables.py --workloads synthetic_0.3 --out NEW  # one workload again, then
    python benchmarks/k_policy_tables.py --render-only --out NEW --from OLD   # every table: NEW's, the rest OLD's
    python benchmarks/k_policy_tables.py --first-process 4 --processes 3 --out NEW  # p4-p6 in a new folder, then
    python benchmarks/k_policy_tables.py --render-only --out NEW --pool OLD   # each pooled with OLD's p1-p3 (OLD=W1,W2: only those)

Each bench's own order of modes and repeats is interleaved (spdflow bench rotates it), so the
ratios inside one table are measured side by side; tables of different workloads ran at
different times: compare their ratios, not their absolute tokens/s.

Repeats within one bench process are not independent: a second process of the same bench moves
the paired ratio by more than one process's 90 % interval. ``--processes N`` (N > 1) therefore
runs N rounds, each running every workload's bench once (so a workload's processes are spread in
time, round-robin across the workloads), into ``<workload>.p<p>.json`` (``.p<p>.md``, ``.p<p>.log``);
``runs.json`` has one record per workload and process. The tables pool a workload's processes
when ``<workload>.json`` is absent (:func:`pool_rows`): every repeat of every process in the medians
and the paired interval, pairs kept within a process, and each process's own paired median
beside them. With one process (the default) the files are ``<workload>.json`` etc. as before.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
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


def result_stem(name: str, process: int, numbered: bool) -> str:
    """The file name (without suffix) of a workload's bench: ``<name>`` with one process, as before
    ``--processes`` existed, and ``<name>.p<process>`` when processes are numbered (several, or
    added to earlier ones with ``--first-process``)."""
    return f"{name}.p{process}" if numbered else name


def plan(names: Sequence[str], processes: int, first: int = 1) -> list[tuple[str, int]]:
    """The (workload, process) benches in the order they run: round p runs every workload once, so
    a workload's processes lie apart in time and a slow spell of the machine hits several workloads'
    single processes rather than all of one workload's. Processes are numbered from ``first``."""
    return [(name, process) for process in range(first, first + processes) for name in names]


def numbered(args) -> bool:
    """Whether this run's files and records carry process numbers (see :func:`result_stem`)."""
    return args.processes > 1 or args.first_process > 1


def clear_previous(out: Path, name: str, processes: int, records: dict) -> None:
    """Before a workload's first bench: remove its earlier results that this run will not overwrite,
    and their run records, so the tables never pool a stale process with new ones, nor prefer an
    earlier run's ``<name>.json`` to new processes (rendering takes ``<name>.json`` first). With one
    process ``<name>.json`` and its record are overwritten in place, as before."""
    pattern = re.compile(re.escape(name) + r"(\.p\d+)" + ("?" if processes > 1 else "") + r"\.(json|md|log)")
    for path in out.iterdir():
        if pattern.fullmatch(path.name):
            path.unlink()
    for key in [k for k in records if k[0] == name and (processes > 1 or k[1] is not None)]:
        del records[key]


def run_workload(workload: Workload, policies: list[str], args, out: Path, process: int = 1) -> dict:
    """One bench (process ``process`` of ``args.processes``, :func:`result_stem` names its files);
    returns its record (command, load before/after, seconds, exit code; with several processes, the
    process number)."""
    stem = result_stem(workload.name, process, numbered(args))
    json_path = out / f"{stem}.json"
    command = bench_command(workload, policies, args.repeats, args.count, json_path, args.batch_sizes, args.overrides)
    shown = [c if c != sys.executable else "python" for c in command]
    shown = [_relative(c) for c in shown]
    record = {"workload": workload.name, **({"process": process} if numbered(args) else {}),
              "command": " ".join(_quote(c) for c in shown), "uptime_before": uptime()}
    print(f"== {stem}: {record['command']}", file=sys.stderr, flush=True)
    start = time.monotonic()
    with open(out / f"{stem}.md", "w") as stdout, open(out / f"{stem}.log", "w") as stderr:
        code = subprocess.run(command, cwd=REPO, stdout=stdout, stderr=stderr).returncode
    record.update(seconds=round(time.monotonic() - start, 1), uptime_after=uptime(), exit_code=code)
    print(f"   {stem}: exit {code} after {record['seconds']} s; {record['uptime_after']}", file=sys.stderr, flush=True)
    return record


def load_records(path: Path) -> dict[tuple[str, int | None], dict]:
    """``runs.json``'s records by (workload, process); a record of one process has no process number
    (as every record of a directory from before ``--processes``): ``None``."""
    return {(r["workload"], r.get("process")): r for r in json.loads(path.read_text())} if path.exists() else {}


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


def static_rows(rows: list[dict]) -> tuple[dict | None, list[dict], dict | None]:
    """One batch's no-spec row, its fixed-K rows by K, and the best fixed K's (highest median tok/s)."""
    nospec = next((r for r in rows if r.get("role") == "baseline" or r.get("mode") == "nospec"), None)
    fixed = sorted((r for r in rows if str(r.get("mode", "")).startswith("fixed:")), key=lambda r: r.get("fixed_k") or 0)
    best = max(fixed, key=lambda r: r.get("tokens_per_s") or 0, default=None)
    return nospec, fixed, best


def reference_row(rows: list[dict]) -> dict | None:
    """The static choice of the measured verdict, for the paired one (its repeats beside the
    policy's): the faster of no-spec and the best fixed K by median tok/s. :func:`pool_rows` pairs
    each process against the same one, so the per-process figures and the table agree."""
    nospec, _, best = static_rows(rows)
    return max([r for r in [nospec, best] if r is not None], key=lambda r: r.get("tokens_per_s") or 0, default=None)


def batch_table(rows: list[dict], policies: list[str]) -> tuple[list[str], dict[str, bool | None]]:
    """The markdown lines of one workload × batch table, and per policy whether it reached the line."""
    nospec, fixed, best = static_rows(rows)
    static = max([r.get("tokens_per_s") or 0 for r in [nospec, best] if r is not None], default=0)
    has_oracle = any(_first(r, "oracle_tokens_per_s") is not None for r in rows)
    has_efficiency = any(_first(r, "policy_efficiency", "efficiency") is not None for r in rows)
    has_regret = any(_first(r, "regret_vs_best_static") is not None for r in rows)
    reference = reference_row(rows)
    has_paired = reference is not None and bool(reference.get("tokens_per_s_by_repeat"))
    # pooled rows (several processes): each policy's paired median per process, to show their spread
    by_process = has_paired and any("paired_by_process" in r for r in rows)
    header = ["mode", "tok/s (min–max)", "÷ max(no-spec, best fixed)", f"≥ {LINE}"]
    header += ["paired ÷ (q1–q3)", f"paired ≥ {LINE}", f"paired {CI_LEVEL:.0%} CI"] * has_paired
    header += ["paired per process"] * by_process + ["AL"]
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
        if by_process:
            medians = row.get("paired_by_process") or []
            cells.append(", ".join(_fmt(m, ".3f") for m in medians) if mark and medians else "—")
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
                         + " — |" * (3 * has_paired + by_process + has_oracle + has_efficiency + has_regret))
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
    different lengths cannot be paired by position: no ratios (no paired verdict). Pooled rows
    (:func:`pool_rows`) concatenate their processes' repeats, so each process's count must agree
    too, or a pair could straddle two processes."""
    if _shape(row) != _shape(reference):
        return []
    return _pair(row.get("tokens_per_s_by_repeat") or [], reference.get("tokens_per_s_by_repeat") or [])


def _shape(row: dict) -> list[int]:
    """The number of repeats of each process of a pooled row; [] for one bench's row."""
    return [len(values) for values in row.get("tokens_per_s_by_process") or []]


def _pair(mine: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """Position by position, mine ÷ theirs; none when the lengths differ (the pairing is unknown)."""
    if len(mine) != len(theirs):
        return []
    return [a / b for a, b in zip(mine, theirs) if a and b]


def merge_values(key: str, values: list):
    """One field of a mode's row over the processes: a value they all agree on as it is; a flag
    (``identical_to_nospec``, ``oracle_exact``) False when any process says False (each process must
    make the claim); a ``*_min`` / ``*_max`` the min / max; another number (AL, acceptance rate, the
    oracle's and priced figures: each process's estimate) their median; anything else (the oracle's
    details, the K histogram) the first process's."""
    if all(v == values[0] for v in values):
        return values[0]
    if any(isinstance(v, bool) for v in values):
        return False if any(v is False for v in values) else values[0]
    numbers = [v for v in values if v is not None]
    if numbers and all(isinstance(v, (int, float)) for v in numbers):
        return min(numbers) if key.endswith("_min") else max(numbers) if key.endswith("_max") else statistics.median(numbers)
    return values[0]


def pool_rows(by_process: Sequence[list[dict]]) -> list[dict]:
    """Several processes' rows of one workload as one row per (mode, batch size): the repeats
    concatenated in process order (``tokens_per_s_by_repeat``; a process without the mode adds none
    and leaves an empty list in ``tokens_per_s_by_process``, so :func:`paired_ratios` refuses to pair
    across it), tok/s the median of all repeats with their min and max, ``repeats`` their number,
    the other fields by :func:`merge_values`; ``processes`` the processes that had the row and
    ``paired_by_process`` each process's own paired median against the table's reference."""
    keys = list(dict.fromkeys((r.get("mode"), r.get("batch_size")) for rows in by_process for r in rows))
    pooled = []
    for key in keys:
        found = [next((r for r in rows if (r.get("mode"), r.get("batch_size")) == key), None) for rows in by_process]
        present = [r for r in found if r is not None]
        row = {k: merge_values(k, [r[k] for r in present if k in r]) for k in dict.fromkeys(k for r in present for k in r)}
        each = [list((r or {}).get("tokens_per_s_by_repeat") or []) for r in found]
        repeats = [v for values in each for v in values]
        row.update(processes=len(present), tokens_per_s_by_process=each, tokens_per_s_by_repeat=repeats)
        if repeats:
            row.update(tokens_per_s=statistics.median(repeats), tokens_per_s_min=min(repeats),
                       tokens_per_s_max=max(repeats), repeats=len(repeats))
        elif "repeats" in row:  # rows without each repeat: their medians' median, but every repeat counted
            row["repeats"] = sum(r.get("repeats") or 0 for r in present)
        pooled.append(row)
    for batch in dict.fromkeys(r.get("batch_size") for r in pooled):
        mine = [r for r in pooled if r.get("batch_size") == batch]
        reference = reference_row(mine)
        for row in mine:
            row["paired_by_process"] = process_medians(row, reference)
    return pooled


def process_medians(row: dict, reference: dict | None) -> list[float | None]:
    """Per process of a pooled row, the median of its own paired ratios to ``reference`` (None where
    that process cannot be paired)."""
    theirs = (reference or {}).get("tokens_per_s_by_process") or []
    medians = []
    for p, mine in enumerate(row.get("tokens_per_s_by_process") or []):
        ratios = _pair(mine, theirs[p]) if p < len(theirs) else []
        medians.append(statistics.median(ratios) if ratios else None)
    return medians


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


def workload_section(workload: Workload, rows: list[dict], policies: list[str], record: dict | None,
                     processes: Sequence[tuple[int, list[dict]]] = (), runs: Sequence[dict] = ()) -> tuple[list[str], dict]:
    """A workload's heading, its run facts and one table per batch size; and the verdicts
    (per batch: the measured ones, and the priced ones under the key ``"priced"``). ``record`` is
    the run record of one bench; pooled rows come with ``processes`` (each process's number and own
    rows) and ``runs`` (their records, by process)."""
    lines = [f"#### {workload.name}: {workload.about}", ""]
    if record:
        lines += [f"`{record['command']}`  ", _run_facts(record), ""]
    if runs:  # each command once, with the processes that ran it (they differ by the .p<p> of their files)
        groups: dict[str, list[dict]] = {}
        for r in runs:
            groups.setdefault(re.sub(r"\.p\d+\.json\b", ".p<p>.json", r["command"]), []).append(r)
        for mine in groups.values():
            others = ", ".join(f".p{r['process']}" for r in mine[1:])
            lines += [f"`{mine[0]['command']}` × {len(mine)} process" + "es" * (len(mine) > 1)
                      + (f" (the same with {others})" if others else "") + ", round-robin with the other workloads:  "]
        lines += [*[f"p{r['process']}: {_run_facts(r)}  " for r in runs], ""]
    by_process = [(p, sorted({r["prompts_sha256"] for r in mine if r.get("prompts_sha256")})) for p, mine in processes]
    digests = sorted({r["prompts_sha256"][:12] for r in [*rows, *(r for _, mine in processes for r in mine)]
                      if r.get("prompts_sha256")})
    if digests:
        lines += [f"prompts sha256 {', '.join(digests)}…", ""]
    if any(found != by_process[0][1] for _, found in by_process):
        lines += ["**the processes decoded different prompts (" + "; ".join(
            f"p{p}: {', '.join(d[:12] for d in found) or 'no digest'}" for p, found in by_process)
            + "): their repeats are pooled all the same, so these tables mix different prompt sets**", ""]
    verdicts = {}
    for batch in sorted({r["batch_size"] for r in rows}):
        mine = [r for r in rows if r["batch_size"] == batch]
        table, reached = batch_table(mine, policies)
        same = all(r.get("identical_to_nospec") is not False for r in mine)
        lines += [f"batch {batch}" + ("" if same else " — **some mode's tokens differ from no-spec**") + ":", "", *table, ""]
        verdicts[batch] = {**reached, "priced": priced_verdicts(mine, policies)}
    return lines, verdicts


def _run_facts(record: dict) -> str:
    """A bench's wall time, the load before and after it, and its exit code when not 0."""
    return (f"{record['seconds']} s; load before: {_load(record['uptime_before'])}, after: "
            f"{_load(record['uptime_after'])}" + ("" if record.get("exit_code") == 0 else
                                                  f"; **bench exit code {record.get('exit_code')}**"))


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


def process_files(out: Path, name: str) -> list[tuple[int, Path]]:
    """A workload's ``<name>.p<p>.json`` files in ``out``, by process number (p10 after p9)."""
    pattern = re.compile(re.escape(name) + r"\.p(\d+)\.json")
    found = [(int(m.group(1)), path) for path in out.glob(f"{name}.p*.json") if (m := pattern.fullmatch(path.name))]
    return sorted(found)


def has_results(folder: Path, name: str) -> bool:
    """Whether ``folder`` holds a workload's results: ``<name>.json`` or any ``<name>.p<p>.json``."""
    return (folder / f"{name}.json").exists() or bool(process_files(folder, name))


def render(out: Path, names: list[str], policies: list[str], records: dict[tuple[str, int | None], dict],
           earlier: Sequence[tuple[Path, dict]] = (),
           pools: Sequence[tuple[Path, dict, set[str] | None]] = ()) -> str:
    """The markdown of every table, tuned-on workloads first, then the held-out ones. A workload's
    rows are ``<name>.json``'s, or when it is absent its processes' pooled (:func:`pool_rows`);
    ``records`` are ``runs.json``'s by (workload, process) (:func:`load_records`). A workload
    without results in ``out`` is read from the first of the ``earlier`` (folder, its records) that
    has them (``--from``), and its section says which folder. A workload's processes there are
    pooled with its processes in the first of ``pools`` (folder, its records, the workloads it is
    for or None for all; ``--pool``) that has any, and its section says which processes came from
    where."""
    sections: dict[str, list[str]] = {TUNED: [], HELD_OUT: []}
    verdicts: dict[str, dict] = {}
    pooled: dict[str, int] = {}  # workload: its processes
    for name in names:
        workload = WORKLOADS[name]
        folder, mine = out, records
        if not has_results(out, name):
            folder, mine = next(((f, r) for f, r in earlier if has_results(f, name)), (out, records))
        pool = next(((f, r) for f, r, only in pools if (only is None or name in only) and process_files(f, name)), None)
        if pool and pool[0].resolve() == folder.resolve():
            pool = None
        made = _section(workload, folder, policies, mine, pool)
        if made is None:
            sections[workload.section] += [f"#### {name}: no results ({shown(out / f'{name}.json')} missing)", ""]
            continue
        lines, verdicts[name], processes = made
        if processes:
            pooled[name] = processes
        notes = []
        if folder != out:
            notes.append(f"(read from `{shown(folder)}/`, an earlier run's folder)")
        if pool and not (folder / f"{name}.json").exists():
            notes.append(f"(pooled with {', '.join(f'p{p}' for p, _ in process_files(pool[0], name))} "
                         f"from `{shown(pool[0])}/`)")
        for note in reversed(notes):
            lines[2:2] = [note, ""]
        sections[workload.section] += lines
    text = [f"Policies: {', '.join(policies)}. A cell reaches the line when the policy's median tok/s ≥ {LINE} × "
            "max(no-spec, best fixed K) of the same bench and batch size; paired: when the median over repeats of "
            f"its tok/s ÷ that static choice's in the same repeat is ≥ the line; paired {CI_LEVEL:.0%} CI: a "
            "distribution-free interval for that median (order statistics of the per-repeat ratios; none under 5 "
            "repeats), and a miss counts as settled when the whole interval is below the line.", "",
            *pooled_note(pooled, names),
            "Batch sizes where a policy is below the line:", "", *summary_table(verdicts, policies), ""]
    for section, title in ((TUNED, "Tuned on (K-policy parameters were fitted on these kinds)"),
                           (HELD_OUT, "Held out (evaluation only: nothing was fitted on them)")):
        if sections[section]:
            text += [f"### {title}", "", *sections[section]]
    return "\n".join(text).rstrip() + "\n"


def _section(workload: Workload, folder: Path, policies: list[str], records: dict,
             pool: tuple[Path, dict] | None = None) -> tuple[list[str], dict, int] | None:
    """A workload's section from ``folder`` (None: no results there): its lines, its verdicts and
    the number of processes it pooled (0: one bench's ``<name>.json``). The workload's processes in
    ``pool`` (a folder, its records) join ``folder``'s; a number in both is refused."""
    path = folder / f"{workload.name}.json"
    parts = [] if path.exists() else process_files(folder, workload.name)
    if parts and pool:
        other, its = pool
        mine = {p for p, _ in parts}
        for p, part in process_files(other, workload.name):
            if p in mine:
                raise SystemExit(f"{workload.name}: process {p} is in both {shown(folder)}/ and {shown(other)}/; "
                                 "number the added processes apart with --first-process")
            parts.append((p, part))
        records = {**records, **{key: r for key, r in its.items() if key[0] == workload.name}}
        parts.sort()
    if parts:
        processes = [(p, json.loads(part.read_text())) for p, part in parts]
        runs = [r for (w, p), r in sorted(records.items(), key=lambda kv: kv[0][1] or 0) if w == workload.name and p]
        lines, verdicts = workload_section(workload, pool_rows([rows for _, rows in processes]), policies,
                                           None, processes, runs)
        return lines, verdicts, len(parts)
    if not path.exists():
        return None
    lines, verdicts = workload_section(workload, json.loads(path.read_text()), policies,
                                       records.get((workload.name, None)))
    return lines, verdicts, 0


def pooled_note(pooled: dict[str, int], names: list[str]) -> list[str]:
    """The intro's paragraph on pooled processes (none when no workload was pooled)."""
    if not pooled:
        return []
    counts = sorted(set(pooled.values()))
    which = "every workload" if len(pooled) == len(names) else ", ".join(pooled)
    number = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return [f"The repeats of {which} come from {number} bench processes (run round-robin across the workloads); "
            "the medians, the paired figures and their interval pool them, pairing repeats only within a process, "
            "and \"paired per process\" gives each process's own paired median. Repeats within one process are not "
            "independent (a second process moves the paired ratio by more than one process's interval), so the "
            "pooled interval is still optimistic.", ""]


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


def pool_arg(text: str) -> tuple[Path, set[str] | None]:
    """``--pool DIR`` or ``--pool DIR=W1,W2``: the folder, and the workloads it pools (None: all)."""
    folder, _, names = text.rpartition("=") if "=" in text else (text, "", "")
    return Path(folder), ({n.strip() for n in names.split(",") if n.strip()} if names else None)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help=f"comma-separated, of: {', '.join(WORKLOADS)} (default: the embedded-model ones)")
    parser.add_argument("--policies", default="", help="K policies to run beside " + " and ".join(DEFAULT_POLICIES))
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode (interleaved; default 3)")
    parser.add_argument("--processes", type=int, default=1,
                        help="bench processes per workload, each with --repeats repeats (default 1). With N > 1: "
                             "N rounds, each running every workload once, into <workload>.p<p>.json, and the tables "
                             "pool the processes' repeats (repeats within one process are not independent)")
    parser.add_argument("--first-process", type=int, default=1, metavar="P",
                        help="number this run's processes from P and keep --out's earlier processes and records, "
                             "so that the tables pool both (more repeats of the same code; default 1: a run replaces "
                             "each workload's earlier results)")
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
    parser.add_argument("--from", dest="earlier", action="append", default=[], type=Path, metavar="DIR",
                        help="an earlier run's folder: a workload with no results in --out is read from the first "
                             "--from folder that has them (repeatable), so a round that re-runs some workloads need "
                             "not copy the others' files")
    parser.add_argument("--pool", dest="pools", action="append", default=[], metavar="DIR[=W1,W2]",
                        help="an earlier run's folder: each workload's processes in --out (or --from's folder) are "
                             "pooled with its processes in the first --pool folder that has any, as --first-process "
                             "pools them in one folder; =W1,W2 limits it to those workloads; repeatable; their process "
                             "numbers must differ")
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
    for flag, value in (("--processes", args.processes), ("--first-process", args.first_process)):
        if value < 1:
            print(f"{flag} must be at least 1", file=sys.stderr)
            return 2
    pools = [pool_arg(text) for text in args.pools]
    for flag, folders in (("--from", args.earlier), ("--pool", [folder for folder, _ in pools])):
        for folder in folders:
            if not folder.is_dir():
                print(f"{flag} {folder}: no such directory; give the folder of an earlier k_policy_tables run",
                      file=sys.stderr)
                return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.json"
    records = load_records(runs_path)
    alone = [n for n in names if (out / f"{n}.json").exists()]
    if args.first_process > 1 and alone and not args.render_only:
        print(f"--first-process {args.first_process}: {out / (alone[0] + '.json')} is a single-process result, which the "
              "tables would take instead of any process added to it; run without --first-process to replace it",
              file=sys.stderr)
        return 2
    failed = []
    if not args.render_only:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        for name, process in plan(names, args.processes, args.first_process):
            if process == 1:
                clear_previous(out, name, args.processes, records)
            key = (name, process if numbered(args) else None)
            stem = result_stem(name, process, numbered(args))
            records[key] = run_workload(WORKLOADS[name], policies, args, out, process)
            runs_path.write_text(json.dumps(list(records.values()), indent=1))
            if records[key]["exit_code"] != 0:
                failed.append(stem)
                print(f"   {stem} failed: see {out / (stem + '.log')}", file=sys.stderr)
    tables = render(out, names, policies, records,
                    [(folder, load_records(folder / "runs.json")) for folder in args.earlier],
                    [(folder, load_records(folder / "runs.json"), only) for folder, only in pools])
    (out / "tables.md").write_text(tables)
    print(tables)
    if args.update_readme is not None:
        update_readme(args.update_readme, tables)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
