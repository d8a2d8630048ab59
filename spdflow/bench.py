"""``spdflow bench``: no-spec, fixed-K and varK on one workload, side by side, plus peers.

Per batch size the target is compiled once for the recipe's K-list plus K = 0 (so no-spec has
its shape) and one session is opened; the modes differ only in proposer and K policy. A mode is a
registered K policy's name (``varK`` is the recipe's own policy), run over that K-list; what the
policy declares it needs (:meth:`spdflow.api.KPolicy.required_ks`) decides its row:

* a policy that only ever needs K = 0 (``nospec``) runs without the proposer; its row, named by
  the policy, is the no-spec reference of the batch size (``delta_vs_nospec``);
* a policy that always verifies one K > 0 (``fixed``: the largest K, a fixed-K SpD system) has a
  row named by the policy, which the K-list rows are compared with (``varK_vs_fixed``: against
  the fixed-K row of the largest K when there are several);
* ``fixed:<K>`` pins any K > 0 of the K-list (row ``fixed:<K>``, a fixed-K system at that K), and
  ``fixed:all`` stands for ``fixed:<K>`` of every K > 0 of the K-list, so one bench shows the best
  fixed K beside the policies;
* any other policy chooses among the K-list; its row is named ``varK:<policy>``.

By default the recipe's policy runs beside ``smallest_covering``, the simplest policy, so every
table shows what a policy's extra machinery buys over it. ``al``, ``acceptance_rate`` and the K histogram are medians over the
repeats, like the timed figures.

A first, untimed no-spec pass warms the session up and gives the greedy reference every mode is
compared with (and that the ``synthetic`` proposer draws from). Then the repeats run with the
mode order rotated each repeat, so machine drift hits every mode alike; the rows carry medians
over repeats plus min/max. Peers (``--peers hf,ort-genai,llama.cpp``, :mod:`spdflow.peers`) run
in child processes kept alive for the batch size, their runs interleaved with the modes in the
same rotated order, so no other engine shares the process — or its thread pool — with the ORT
timing loop.

Memory: all modes share one process and one session, so the process's high-water mark says
nothing per mode. ``peak_rss_mb`` is the largest resident set sampled (every 20 ms) while that
mode ran — shared session and weights included — and ``rss_growth_mb`` is that peak minus the
resident set just before the mode started: what the mode itself added.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from spdflow.api import KPolicy
from spdflow.errors import StageError, UsageError
from spdflow.recipe.schema import REFERENCE_POLICY
from spdflow.workload import prompts_digest

#: the mode that runs the recipe's own K policy
RECIPE_POLICY_MODE = "varK"
#: ``--modes``'s default: no-spec, fixed K, the recipe's policy and the reference policy
DEFAULT_MODES = ("nospec", "fixed", RECIPE_POLICY_MODE, REFERENCE_POLICY)
#: a row's mode for the K-list with policy NAME
VARK_PREFIX = "varK:"
#: ``fixed:<K>``: a fixed-K row at one K of the K-list; ``fixed:all``: one such row per K > 0
FIXED_PREFIX, FIXED_ALL = "fixed:", "fixed:all"
#: A row's role, from what its policy needs on the compiled K-list: the no-spec reference (only
#: K = 0), a fixed-K system (one K > 0), a policy choosing among the K-list, or a peer engine.
BASELINE, ONE_K, VARK, PEER = "baseline", "one_k", "varK", "peer"
PEERS = ("hf", "ort-genai", "llama.cpp")

#: Keys every JSON row has (``*_min``/``*_max`` accompany each timed metric).
ROW_KEYS = ("mode", "batch_size", "requests_per_s", "tokens_per_s", "tpot_ms", "al",
            "identical_to_nospec", "peak_rss_mb")
#: Metrics reported as median over repeats with min and max.
TIMED = ("requests_per_s", "tokens_per_s", "decode_tokens_per_s", "tpot_ms", "host_frac", "outside_verify_frac", "peak_rss_mb",
         "rss_growth_mb")


@dataclass
class BenchOptions:
    """What ``spdflow bench`` runs: batch sizes, modes, peers, repeats, where the JSON goes."""

    batch_sizes: list[int] | None = None  # None: the recipe's own batch size
    modes: list[str] = field(default_factory=lambda: list(DEFAULT_MODES))
    peers: list[str] = field(default_factory=list)
    repeats: int = 3
    json_path: Path | None = None
    #: the oracle and regret columns of K-list policy rows (greedy, with a proposer)
    oracle: bool = True


@dataclass(frozen=True)
class Mode:
    """A resolved bench mode: the row it fills, the K policy it runs and the row's role."""

    row: str
    policy: str
    role: str
    k: int | None = None  # the pinned K of a fixed:<K> mode

    @property
    def speculates(self) -> bool:
        """Whether the recipe's proposer runs (every role but the no-spec reference)."""
        return self.role != BASELINE


@dataclass
class ModeRun:
    """One timed run of one mode at one batch size."""

    mode: str
    batch_size: int
    repeat: int
    metrics: Any  # spdflow.report.metrics.Metrics
    tokens: dict[int, list[int]]
    peak_rss_mb: float
    rss_growth_mb: float
    role: str = VARK
    records: list[dict] = field(default_factory=list)  # the run's trace (prices it for the oracle)


# ------------------------------------------------------------------------------ planning


def check_options(options: BenchOptions) -> None:
    """Reject unknown peers and nonsense counts with one sentence each (modes: :func:`resolve_modes`)."""
    if not options.modes:
        raise UsageError("--modes names no mode", hint=f"e.g. --modes {','.join(DEFAULT_MODES)}")
    unknown = [p for p in options.peers if p not in PEERS]
    if unknown:
        raise UsageError(f"unknown peer '{unknown[0]}'", hint=f"choose from {', '.join(PEERS)}")
    if options.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    if options.batch_sizes is not None and any(b < 1 for b in options.batch_sizes):
        raise UsageError("batch sizes must be at least 1")


def resolve_modes(pm, modes: Sequence[str], recipe) -> list[Mode]:
    """The modes to run, in order, each row once. A mode is a registered K policy's name (also
    written ``varK:<policy>``), or ``varK``: the recipe's policy. The policy's row and role come
    from the Ks it needs on the bench's K-list (:func:`policy_role`)."""
    from spdflow.plugins import make_k_policy

    policies = policy_names(pm)
    ks = compile_k_list(recipe)
    resolved: list[Mode] = []
    for mode in modes:
        if mode.startswith(FIXED_PREFIX):
            for k in pinned_ks(mode, ks):
                if FIXED_PREFIX + str(k) not in [m.row for m in resolved]:
                    resolved.append(Mode(FIXED_PREFIX + str(k), FIXED_PREFIX + str(k), ONE_K, k))
            continue
        name = recipe.k_policy.uses if mode == RECIPE_POLICY_MODE else mode.removeprefix(VARK_PREFIX)
        if name not in policies:
            raise UsageError(f"unknown bench mode '{mode}'",
                             hint=f"choose {RECIPE_POLICY_MODE} (the recipe's K policy) or a K policy: "
                                  f"{', '.join(sorted(policies))}")
        role = policy_role(make_k_policy(pm, name, own_settings(recipe, name)), ks)
        row = VARK_PREFIX + name if role == VARK else name
        if row not in [m.row for m in resolved]:
            resolved.append(Mode(row, name, role))
    return resolved


def pinned_ks(mode: str, ks: Sequence[int]) -> list[int]:
    """The Ks a ``fixed:<K>`` or ``fixed:all`` mode pins on the compiled K-list ``ks``; a K that
    is not a K > 0 of the list is a usage error."""
    speculative = [k for k in ks if k > 0]
    choices = ", ".join([FIXED_PREFIX + str(k) for k in speculative] + [FIXED_ALL])
    if mode == FIXED_ALL:
        if not speculative:
            raise UsageError(f"bench mode '{mode}' needs a K > 0 in the recipe's K-list, which is {list(ks)}",
                             hint="add Ks to num_speculative_tokens")
        return speculative
    text = mode.removeprefix(FIXED_PREFIX)
    if not text.isdigit() or int(text) not in speculative:
        raise UsageError(f"bench mode '{mode}' names no K > 0 of the recipe's K-list {list(ks)}",
                         hint=f"choose {choices}" if speculative else "add Ks to num_speculative_tokens")
    return [int(text)]


class PinnedK(KPolicy):
    """The K policy of a ``fixed:<K>`` mode: always K (one compiled K > 0 of the list)."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k
        self.name = FIXED_PREFIX + str(k)

    def required_ks(self, compiled_ks):
        return [self.k]

    def choose_k(self, proposal_counts, compiled_ks):
        return self.k


def mode_policy(pm, mode: Mode, recipe):
    """A fresh K policy for one run of ``mode``."""
    from spdflow.plugins import make_k_policy

    if mode.k is not None:
        return PinnedK(mode.k)
    return make_k_policy(pm, mode.policy, own_settings(recipe, mode.policy))


def policy_role(policy, ks: Sequence[int]) -> str:
    """A policy's row role on the compiled K-list ``ks``, from the Ks it declares it needs:
    :data:`BASELINE` when that is K = 0 alone (it never verifies a proposal), :data:`ONE_K` when
    it is one K > 0 (a fixed-K system), else :data:`VARK`."""
    from spdflow.plugins import required_ks, speculates

    if not speculates(policy, ks):
        return BASELINE
    return ONE_K if len(set(required_ks(policy, ks))) == 1 else VARK


def own_settings(recipe, policy_name: str) -> dict:
    """The recipe's ``k_policy.with`` when it names ``policy_name``, else none (defaults)."""
    return dict(recipe.k_policy.with_) if recipe.k_policy.uses == policy_name else {}


Item = TypeVar("Item")


def run_order(modes: Sequence[Item], repeats: int) -> list[tuple[int, Item]]:
    """(repeat, mode) pairs, the mode order rotated by one each repeat so no mode always runs
    first (or right after the same neighbour); a mode may be any value (a row name, a variant)."""
    modes = list(modes)
    order = []
    for r in range(repeats):
        shift = r % len(modes) if modes else 0
        order += [(r, m) for m in modes[shift:] + modes[:shift]]
    return order


def compile_k_list(recipe) -> list[int]:
    """The recipe's K-list plus 0, so the no-spec mode has its decode shape."""
    return sorted(set(recipe.k_list()) | {0})


def batch_recipe(recipe, batch_size: int):
    """The recipe at one batch size: full_batch_size under continuous batching, else batch_size."""
    spec = recipe.specialization
    if spec.full_batch_size is not None:
        spec = spec.model_copy(update={"full_batch_size": batch_size})
    else:
        spec = spec.model_copy(update={"batch_size": batch_size})
    return recipe.model_copy(update={"specialization": spec})


# ------------------------------------------------------------------------------ memory


def current_rss_mb() -> float:
    """The process's resident set now (MiB), from /proc; falls back to the high-water mark."""
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        from spdflow.report.model import peak_rss_mb

        return peak_rss_mb()


class RssSampler:
    """Samples the resident set on a thread while a block runs; ``peak`` and ``before`` in MiB."""

    def __init__(self, interval_s: float = 0.02):
        self.interval_s = interval_s
        self.before = self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, current_rss_mb())

    def __enter__(self):
        self.before = self.peak = current_rss_mb()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, current_rss_mb())
        return False


# ------------------------------------------------------------------------------ one batch size


class BatchBench:
    """One compiled program and one session at one batch size; runs any mode on them."""

    def __init__(self, pm, loaded, batch_size: int, ui):
        from spdflow.engine.run import Engine, RunOptions

        self.pm = pm
        self.batch_size = batch_size
        self.recipe = batch_recipe(loaded.recipe, batch_size)
        self.loaded = dataclasses.replace(loaded, recipe=self.recipe)
        self.engine = Engine(pm, self.loaded, RunOptions(), ui)
        self.ui = ui
        self.baseline: dict[int, np.ndarray] = {}
        self.session = None

    def open(self) -> None:
        """Compile (cached) for the K-list plus 0, then the engine's own generation setup:
        tokenized workload, target session, loop configuration."""
        recipe = self.recipe
        program, self.info = self.engine.build_model(recipe.model, "target", compile_k_list(recipe), recipe.devices)
        if not program.runnable:
            raise StageError("the compiled program cannot run on this machine", hint="bench needs a runnable backend")
        prepared = self.engine.prepare_generation(program, self.info)
        self.tokenizer, self.requests, self.session = prepared.tokenizer, prepared.requests, prepared.session
        self.sampling, self.config = prepared.sampling, prepared.config
        self.prompts_sha256 = prompts_digest(prepared.prompts)
        self.info = prepared.info  # with a chat template's end-of-turn ids among the EOS ids
        self.nospec_config = dataclasses.replace(self.config, k_list=[0])

    def close(self) -> None:
        """Close every session the engine opened."""
        self.engine.close_sessions()

    def warm_up(self) -> None:
        """An untimed greedy no-spec pass: warms the session and records the reference tokens."""
        records: list[dict] = []
        results = self._generate(None, records)
        self.baseline = {r.index: r.tokens for r in results}

    def run(self, mode: Mode, repeat: int) -> ModeRun:
        """One timed run of ``mode``; the proposer is built before the clock starts."""
        from spdflow.report.metrics import compute_metrics

        records: list[dict] = []
        with RssSampler() as rss:
            results = self._generate(mode, records)
        tokens = {r.index: r.tokens.tolist() for r in results}
        return ModeRun(mode.row, self.batch_size, repeat, compute_metrics(records), tokens,
                       round(rss.peak, 1), round(rss.peak - rss.before, 1), mode.role, records)

    def _generate(self, mode: Mode | None, records: list) -> list:
        """One generation: ``mode``'s policy with the recipe's proposer when the mode speculates;
        without a mode (or proposer), K = 0 every step and no policy runs."""
        from spdflow.engine.generate import Generator

        recipe = self.recipe
        policy = None if mode is None else mode_policy(self.pm, mode, recipe)
        acceptor = self.engine.make_acceptor()
        proposer, name = None, ""
        if mode is not None and mode.speculates and recipe.proposer is not None:
            proposer, name = self.engine.make_proposer(self.info, self.sampling, self.baseline), recipe.proposer.uses
        config = self.config if proposer is not None else self.nospec_config
        generator = Generator(self.pm, self.session, config, proposer=proposer, proposer_name=name,
                              policy=policy, acceptor=acceptor, trace=records.append, step_costs=self.engine.step_costs)
        try:
            return generator.generate(self.requests)
        finally:
            if proposer is not None:
                proposer.close()


# ------------------------------------------------------------------------------ summarizing


def _stats(values: list[float | None]) -> tuple[float | None, float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def run_values(run: ModeRun) -> dict[str, float | None]:
    """The per-run numbers a row summarizes (times in ms, fractions of decode step time)."""
    m = run.metrics
    decode = m.decode_time_s
    return {
        "requests_per_s": m.requests_per_s,
        "tokens_per_s": m.e2e_tokens_per_s,
        "decode_tokens_per_s": m.decode_tokens_per_s,
        "tpot_ms": None if m.tpot_median_s is None else m.tpot_median_s * 1000,
        "host_frac": m.host_fraction,
        "outside_verify_frac": (m.host_s + m.propose_s) / decode if decode else None,
        "peak_rss_mb": run.peak_rss_mb,
        "rss_growth_mb": run.rss_growth_mb,
    }


def summarize(runs: list[ModeRun], reference: dict[int, list[int]] | None) -> list[dict]:
    """One row per (batch size, mode): medians over repeats with min/max, AL, identity."""
    groups: dict[tuple[int, str], list[ModeRun]] = {}
    for run in runs:
        groups.setdefault((run.batch_size, run.mode), []).append(run)
    rows = []
    for (batch, mode), mine in groups.items():
        row: dict[str, Any] = {"mode": mode, "batch_size": batch, "repeats": len(mine), "role": mine[0].role}
        values = [run_values(r) for r in mine]
        # Each repeat's rate, in repeat order: modes of one repeat ran back to back (interleaved),
        # so ratios taken within a repeat cancel the drift between repeats.
        in_order = sorted(range(len(mine)), key=lambda i: mine[i].repeat)
        row["tokens_per_s_by_repeat"] = [values[i]["tokens_per_s"] for i in in_order]
        for key in TIMED:
            med, lo, hi = _stats([v[key] for v in values])
            row[key], row[f"{key}_min"], row[f"{key}_max"] = med, lo, hi
        metrics = [r.metrics for r in mine]
        row["policy"] = mode.removeprefix(VARK_PREFIX)
        if mode.startswith(FIXED_PREFIX) and mode.removeprefix(FIXED_PREFIX).isdigit():
            row["fixed_k"] = int(mode.removeprefix(FIXED_PREFIX))
        row["al"] = _stats([m.mean_acceptance_length for m in metrics])[0]
        row["acceptance_rate"] = _stats([m.draft_acceptance_rate for m in metrics])[0]
        row["k_histogram"] = median_histogram([m.k_histogram for m in metrics])
        row["generated_tokens"] = _stats([m.generated_tokens for m in metrics])[0]
        row["identical_to_nospec"] = None if reference is None else all(r.tokens == reference for r in mine)
        rows.append(row)
    return rows


def median_histogram(histograms: Sequence[dict]) -> dict[str, float]:
    """Per K, the median over repeats of how many steps ran it (a repeat without K counts 0)."""
    ks = sorted({int(k) for h in histograms for k in h})
    return {str(k): statistics.median([h.get(k, h.get(str(k), 0)) for h in histograms]) for k in ks}


def add_deltas(rows: list[dict]) -> list[dict]:
    """Δ tokens/s vs the no-spec row (role :data:`BASELINE`) of the same batch size, and varK rows
    vs the fixed-K row (role :data:`ONE_K`; of several, ``fixed`` or else the largest ``fixed:<K>``),
    both as ratios − 1.

    Rows without the needed partner (or with no throughput) get None.
    """
    by: dict[tuple[int, str | None], dict] = {}
    for row in rows:
        by.setdefault((row["batch_size"], row.get("role")), row)
    for row in rows:  # several fixed-K rows: the largest K's (plain ``fixed`` is the largest K)
        key = (row["batch_size"], ONE_K)
        if row.get("role") == ONE_K and _fixed_rank(row) > _fixed_rank(by[key]):
            by[key] = row
    for row in rows:
        base = by.get((row["batch_size"], BASELINE))
        row["delta_vs_nospec"] = _delta(row.get("tokens_per_s"), base and base.get("tokens_per_s"))
        fixed = by.get((row["batch_size"], ONE_K))
        row["varK_vs_fixed"] = _delta(row.get("tokens_per_s"), fixed and fixed.get("tokens_per_s")) \
            if row.get("role") == VARK else None
    return rows


def _fixed_rank(row: dict) -> float:
    return float("inf") if row.get("fixed_k") is None else row["fixed_k"]


def _delta(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return value / base - 1.0


def reference_tokens(bench: BatchBench) -> dict[int, list[int]]:
    """The warm-up's greedy no-spec tokens as lists (what every mode is compared with)."""
    return {i: t.tolist() for i, t in bench.baseline.items()}


# ------------------------------------------------------------------------------ rendering


def _fmt(value, spec: str = ".1f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def _pct(value) -> str:
    return "—" if value is None else f"{value * 100:+.1f}%"


def _same(value) -> str:
    return "—" if value is None else ("yes" if value else "NO")


TABLE_COLUMNS = ("batch", "mode", "req/s", "tok/s (min–max)", "TPOT ms", "AL", "Δ vs no-spec", "varK vs fixed",
                 "oracle tok/s", "policy eff.", "regret", "host %", "peak RSS MiB (+mode)", "same tokens")


def table_cells(row: dict) -> list[str]:
    """The table's cells for one row (strings)."""
    spread = f"{_fmt(row['tokens_per_s'])} ({_fmt(row.get('tokens_per_s_min'), '.0f')}–{_fmt(row.get('tokens_per_s_max'), '.0f')})"
    host = row.get("outside_verify_frac")
    rss = f"{_fmt(row.get('peak_rss_mb'), '.0f')} ({_fmt(row.get('rss_growth_mb'), '+.0f')})"
    return [str(row["batch_size"]), row["mode"], _fmt(row.get("requests_per_s"), ".2f"), spread,
            _fmt(row.get("tpot_ms"), ".2f"), _fmt(row.get("al"), ".2f"), _pct(row.get("delta_vs_nospec")),
            _pct(row.get("varK_vs_fixed")), _oracle_cell(row), _fmt(row.get("policy_efficiency"), ".3f"),
            _pct(row.get("regret_vs_best_static")), _fmt(None if host is None else host * 100, ".1f"), rss,
            _same(row.get("identical_to_nospec")) + _where(row.get("divergence"))]


def _oracle_cell(row: dict) -> str:
    """The oracle's priced tok/s, marked * when it is a beam's best found (not proven best)."""
    value = row.get("oracle_tokens_per_s")
    return "—" if value is None else _fmt(value) + ("" if row.get("oracle_exact") else "*")


def _where(divergence: dict | None) -> str:
    """Where a peer first differs from spdflow's no-spec (request, generated-token index)."""
    if not divergence:
        return ""
    return (f" (request {divergence['request']} token {divergence['position']}; "
            f"{divergence['requests_differing']}/{divergence['requests']} requests differ)")


def rich_table(rows: list[dict], title: str = ""):
    """The bench table as a rich Table."""
    from rich.table import Table

    table = Table(*TABLE_COLUMNS, title=title or None)
    for row in rows:
        table.add_row(*table_cells(row))
    return table


def markdown_table(rows: list[dict]) -> str:
    """The same table in markdown (for README files and reports)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(table_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def sort_rows(rows: list[dict]) -> list[dict]:
    """By batch size, then the no-spec row, fixed K, the varK rows (by policy), then peers."""
    rank = {BASELINE: 0, ONE_K: 1, VARK: 2}
    return sorted(rows, key=lambda r: (r["batch_size"], rank.get(r.get("role"), 3), r["mode"]))


# ------------------------------------------------------------------------------ the bench


def bench_batch(pm, loaded, batch_size: int, options: BenchOptions, ui,
                progress: Callable[[str], None]) -> list[dict]:
    """All modes (and peers) at one batch size: rows with deltas. Peers' runs interleave with
    spdflow's in the same rotated order (each peer family a child process kept alive)."""
    from spdflow.peers import peer_rows, start_peers

    modes = resolve_modes(pm, options.modes, loaded.recipe)
    bench = BatchBench(pm, loaded, batch_size, ui)
    peers: list = []
    try:
        bench.open()
        progress(f"batch {batch_size}: warm-up (no-spec reference)")
        bench.warm_up()
        reference = reference_tokens(bench)
        greedy = bench.sampling.temperature == 0
        if options.peers:
            peers = start_peers(options.peers, loaded, bench.recipe, bench.info, bench.requests, batch_size,
                                options.repeats, peer_work_dir(bench.recipe), progress)
        peer_of = {mode: peer for peer in peers for mode in peer.modes}
        runs, peer_runs = [], []
        by_row = {mode.row: mode for mode in modes}
        for repeat, name in run_order(list(by_row) + list(peer_of), options.repeats):
            if name in peer_of:
                result = peer_of[name].run(name)
                peer_runs.append(result)
                rate = result["tokens_per_s"]
            else:
                run = bench.run(by_row[name], repeat)
                runs.append(run)
                rate = run.metrics.e2e_tokens_per_s or 0
            progress(f"batch {batch_size} repeat {repeat + 1}/{options.repeats} {name}: {rate:.1f} tok/s")
        rows = summarize(runs, reference if greedy else None)
        if options.oracle:
            add_oracle(pm, bench, rows, runs, progress)
        rows += peer_rows(peer_runs, batch_size, reference if greedy else None)
        for row in rows:
            row["prompts_sha256"] = bench.prompts_sha256
    finally:
        for peer in peers:
            peer.close()
        bench.close()
    return rows


def add_oracle(pm, bench: BatchBench, rows: list[dict], runs: list[ModeRun], progress: Callable[[str], None]) -> None:
    """Oracle columns for the K-list policy rows of one batch size (:mod:`spdflow.oracle`).

    One cost model prices every row: each K's verify time is the mean over every timed run at
    this batch size of the steps that verified it (all modes pooled: no-spec gives K = 0, fixed
    its K), a K run fewer than 5 times taken from a grid timed on the same session afterwards
    (which also gives the switch cost). The oracle is computed once per batch size over the
    warm-up's greedy tokens: one proposer pass per request and K of the list, then the search.
    Rows get ``oracle_tokens_per_s``, ``policy_priced_tokens_per_s`` (the row's own runs priced
    alike, beside its measured tok/s), ``policy_efficiency`` and ``regret_vs_best_static``
    (medians over repeats), and an ``oracle_detail``. Skipped (None) for sampled workloads and
    without a proposer; ``--no-oracle`` skips it (a draft-model proposer makes the pass costly).
    """
    from spdflow.costs import measure_grid
    from spdflow.oracle import MeasuredSteps, trace_oracle

    policy_rows = [row for row in rows if row.get("role") == VARK]
    if not policy_rows or bench.sampling.temperature != 0 or bench.recipe.proposer is None:
        return
    progress(f"batch {bench.batch_size}: oracle (proposer pass per request and K, then the search)")
    config, ks = bench.config, compile_k_list(bench.recipe)
    traces = [run.records for run in runs]
    gaps = [float(s.get("host_s", 0.0)) + float(s.get("propose_s", 0.0)) for t in traces for s in t
            if s.get("kind") == "step"]
    grid = measure_grid(pm, bench.session, bench.batch_size, ks, config.pad_token_id, config.prefill_seq_len,
                        config.full_batch_size is not None, gap_s=statistics.median(gaps) if gaps else 0.0)
    cost = MeasuredSteps(bench.batch_size, traces, grid)
    oracle = trace_oracle(pm, bench.engine, bench.info, bench.requests, bench.baseline, ks, bench.batch_size,
                          config.full_batch_size is not None, traces, cost, static=static_traces(runs))
    progress(f"batch {bench.batch_size}: {oracle.label} {oracle.oracle_tokens_per_s:.1f} tok/s "
             f"(priced; computed in {oracle.seconds:.1f} s)")
    for row in policy_rows:
        figures = [oracle.against(run.records) for run in runs if run.mode == row["mode"]]
        for key in ("policy_priced_tokens_per_s", "policy_efficiency", "regret_vs_best_static"):
            row[key] = statistics.median(f[key] for f in figures)
        row["oracle_tokens_per_s"] = oracle.oracle_tokens_per_s
        row["oracle_exact"] = oracle.found.exact
        row["oracle_detail"] = oracle.to_json()


def static_traces(runs: Sequence[ModeRun]) -> dict[int, list[list[dict]]]:
    """The traces of the static runs per K: no-spec's for K = 0, each ``fixed:<K>``'s for K (what
    the bench's oracle prices a step's host and proposer time from, :func:`spdflow.oracle.step_overheads`)."""
    static: dict[int, list[list[dict]]] = {}
    for run in runs:
        if run.role == BASELINE:
            static.setdefault(0, []).append(run.records)
        elif run.mode.startswith(FIXED_PREFIX) and run.mode.removeprefix(FIXED_PREFIX).isdigit():
            static.setdefault(int(run.mode.removeprefix(FIXED_PREFIX)), []).append(run.records)
    return static


def peer_work_dir(recipe) -> Path:
    """Where peers keep their converted models: ``peers/`` in the recipe's output directory."""
    return recipe.output_dir() / "peers"


def policy_names(pm) -> list[str]:
    """The registered K policies (and their aliases)."""
    return list(pm.registry()["k_policy"])


def bench_recipe(pm, loaded, options: BenchOptions, ui=None) -> list[dict]:
    """Run the bench; returns the rows (also written to ``options.json_path`` when set)."""
    from spdflow.engine.run import NullUI

    check_options(options)
    ui = ui or NullUI()
    recipe = loaded.recipe
    modes = resolve_modes(pm, options.modes, recipe)  # an unknown mode fails before any work
    needs_proposer = [m.row for m in modes if m.speculates]
    if needs_proposer and recipe.proposer is None:
        no_spec = [m.row for m in resolve_modes(pm, policy_names(pm), recipe) if not m.speculates]
        raise UsageError(f"mode '{needs_proposer[0]}' needs a proposer but the recipe has none",
                         hint="add a proposer to the recipe" + (f" or use --modes {no_spec[0]}" if no_spec else ""))
    sizes = options.batch_sizes or [recipe.specialization.full_batch_size or recipe.specialization.batch_size]
    rows: list[dict] = []
    for batch_size in sizes:
        rows += bench_batch(pm, loaded, batch_size, options, ui, ui.message)
    rows = sort_rows(add_deltas(rows))
    if options.json_path is not None:
        from spdflow.files import write_json_atomic

        options.json_path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(options.json_path, rows)
    return rows
