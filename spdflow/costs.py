"""Measured step costs stored with a run (``cost_grid.json``), for what-if pricing.

After generation the engine times every compiled decode shape of the run's session at the
run's batch size (:func:`measure_grid`) and writes the result into the run directory;
``spdflow whatif`` / ``advise`` add entries for other batch sizes or K on demand, measured the
same way on the same backend. The ``measured`` cost model (``plugins/spdflow_costs``) reads them.

Every timed run has all positions at -1, so it writes only the reserved last KV slot and never
touches a request's cache (as :func:`spdflow.engine.generate.measure_step_costs`).
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from spdflow.errors import RunDataError

GRID_FILE = "cost_grid.json"
GRID_VERSION = 1


@dataclass
class GridEntry:
    """Step costs of one batch size on one backend, medians in seconds.

    ``verify_s[K]`` is a verify run repeated at the same K; ``switch_s`` the extra time of the
    first run after a change of K (mean of both directions between the smallest and largest
    K timed); ``prefill_s`` one prefill chunk of ``prefill_seq_len`` tokens.
    """

    batch: int
    verify_s: dict[int, float]
    switch_s: float
    prefill_s: float | None
    prefill_seq_len: int
    repeats: int
    measured_at: str = ""
    load: list[float] = field(default_factory=list)

    def to_json(self) -> dict:
        data = asdict(self)
        data["verify_s"] = {str(k): v for k, v in sorted(self.verify_s.items())}
        return data

    @staticmethod
    def from_json(data: dict) -> "GridEntry":
        data = dict(data)
        data["verify_s"] = {int(k): float(v) for k, v in data["verify_s"].items()}
        return GridEntry(**data)


def _time_runs(pm, session, shapes: Sequence[tuple[int, int, int]], pad_token_id: int,
               batch_index: np.ndarray | None, gap_s: float = 0.0, clock=time.perf_counter) -> list[float]:
    """Seconds of each run of ``shapes`` (rows, seq_len, num_logits_to_keep), in order.

    ``gap_s`` > 0 keeps the host busy that long after each run (as a generation step's own host
    work does): a backend's worker threads then stop spinning between runs as they do in a real
    generation, instead of finding the next run waiting, which makes small shapes look faster
    than they run in a generation."""
    times = []
    for rows, seq_len, keep in shapes:
        ids = np.full((rows, seq_len), pad_token_id, dtype=np.int64)
        pos = np.full((rows, seq_len), -1, dtype=np.int64)
        start = clock()
        pm.hook.spdflow_verify(session=session, input_ids=ids, position_ids=pos, num_logits_to_keep=keep,
                               batch_index=batch_index)
        end = clock()
        times.append(end - start)
        while gap_s > 0 and clock() - end < gap_s:
            pass
    return times


def time_round(pm, session, rows: int, ks: Sequence[int], pad_token_id: int, batch_index: np.ndarray | None,
               round_: int, warmup: int, repeats: int, gap_s: float = 0.0, clock=time.perf_counter) -> dict[int, list[float]]:
    """One round of decode timings: every K of ``ks`` as a short block (``warmup`` untimed runs,
    then ``repeats`` timed), the order of K rotated by ``round_``, so that over several rounds a
    burst of load on a shared machine lands on every K alike. The timed seconds per K."""
    ks = list(ks)
    timed: dict[int, list[float]] = {}
    for k in ks[round_ % len(ks):] + ks[: round_ % len(ks)]:
        shape = (rows, k + 1, k + 1)
        timed[k] = _time_runs(pm, session, [shape] * (warmup + repeats), pad_token_id, batch_index, gap_s, clock)[warmup:]
    return timed


def measure_grid(pm, session, rows: int, ks: Sequence[int], pad_token_id: int, prefill_seq_len: int,
                 continuous_batching: bool = False, rounds: int = 5, repeats: int = 3, warmup: int = 2,
                 gap_s: float = 0.0) -> GridEntry:
    """Time every decode shape in ``ks``, the switch between the smallest and the largest K, and
    the prefill shape, on an open session.

    The machine may be shared, so the timing is spread out: each of ``rounds`` rounds times a
    short block of every K (``warmup`` untimed runs, then ``repeats`` timed; the K order rotates
    per round), then alternates the smallest and largest K, then one prefill. Each figure is the
    median over rounds of the round's median, so a burst of load hits every shape alike.
    ``gap_s``: host time kept busy after every run (see :func:`_time_runs`).
    """
    ks = sorted(set(ks))
    decode_index = np.arange(rows, dtype=np.int64).reshape(-1, 1) if continuous_batching else None
    prefill_rows = 1 if continuous_batching else rows
    prefill_index = np.zeros((1, 1), dtype=np.int64) if continuous_batching else None
    prefill_shape = (prefill_rows, prefill_seq_len, 1)
    lo, hi = ks[0], ks[-1]
    steady: dict[int, list[float]] = {k: [] for k in ks}
    switch: list[float] = []
    prefill: list[float] = []
    for round_ in range(rounds):
        for k, times in time_round(pm, session, rows, ks, pad_token_id, decode_index, round_, warmup, repeats,
                                   gap_s).items():
            steady[k].append(statistics.median(times))
        if lo != hi:
            pattern = [(rows, lo + 1, lo + 1), (rows, hi + 1, hi + 1)] * (1 + repeats)
            times = _time_runs(pm, session, pattern, pad_token_id, decode_index, gap_s)[2:]
            after_hi, after_lo = times[0::2], times[1::2]  # K=lo right after hi, K=hi right after lo
            switch.append((statistics.median(after_hi) - steady[lo][-1] + statistics.median(after_lo) - steady[hi][-1]) / 2)
        prefill.append(_time_runs(pm, session, [prefill_shape] * 2, pad_token_id, prefill_index)[1])
    return GridEntry(rows, {k: statistics.median(v) for k, v in steady.items()},
                     max(0.0, statistics.median(switch)) if switch else 0.0, statistics.median(prefill),
                     prefill_seq_len, rounds * repeats, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     list(_load()))


def _load() -> tuple[float, ...]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return ()


def read_grid(run_dir: Path) -> dict[int, GridEntry]:
    """The stored entries of a run, by batch size ({} when there is no file)."""
    path = Path(run_dir) / GRID_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != GRID_VERSION:
            raise RunDataError(f"'{path}' has cost grid version {data.get('version')!r}; this spdflow reads version "
                               f"{GRID_VERSION}", hint="delete the file; whatif measures it again")
        return {int(e["batch"]): GridEntry.from_json(e) for e in data["entries"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise RunDataError(f"'{path}' is unreadable ({type(exc).__name__}: {exc})",
                           hint="delete the file; whatif measures it again") from exc


def write_grid(run_dir: Path, entries: dict[int, GridEntry], backend: str) -> None:
    """Store the entries with the run (atomic)."""
    from spdflow.files import write_json_atomic

    data = {"version": GRID_VERSION, "backend": backend,
            "entries": [entries[b].to_json() for b in sorted(entries)]}
    write_json_atomic(Path(run_dir) / GRID_FILE, data)


def merge_entry(old: GridEntry | None, new: GridEntry) -> GridEntry:
    """``new``, keeping K values only ``old`` has (measured earlier on the same backend)."""
    if old is None:
        return new
    verify = {**old.verify_s, **new.verify_s}
    return GridEntry(new.batch, verify, new.switch_s, new.prefill_s, new.prefill_seq_len, new.repeats,
                     new.measured_at, new.load)


# ------------------------------------------------------------------------------ the run's own steps


@dataclass
class InSitu:
    """Step times of a run's own generation, from its trace: what its verify runs took there,
    with the host work, the proposer and the backend's threads as they really interleave."""

    batch: int
    #: mean seconds of the run's verify runs per K (the mean, not the median: a throughput is a
    #: sum of step times, slow steps included), and how many steps each mean is of
    verify_s: dict[int, float]
    steps: dict[int, int]
    #: mean host seconds per step (step time outside proposer and verify), and the median of
    #: host + proposer per step (the gap a verify run follows in a generation)
    host_per_step_s: float
    gap_s: float
    #: how many of each K's steps were among the first :data:`AFTER_CHANGE` after a change of K or
    #: a prefill (slower than the K's later steps: their mean carries the switch's time)
    after_change: dict[int, int] = field(default_factory=dict)


#: a K a generation verified fewer times than this is priced from a timed grid (scaled by
#: :func:`level_scale`) rather than from the mean of its few steps
MIN_STEPS = 5

#: steps after a change of K (or a prefill) that run slower than the K's later ones: on the CPU
#: at batch 1, K = 7's took 1.79, 1.75, 1.63 and 1.60 ms, then 1.57 (issue 23, round 28)
AFTER_CHANGE = 4


def level_scale(own: dict[int, float], grid: dict[int, float]) -> float:
    """The median ratio of a generation's own mean verify time to the grid's, over the K both
    have (1.0 when none): what a K priced from the grid alone is scaled by, so that every K of
    one batch size is priced at one level. The grid times runs outside a generation, where their
    level differs (at batch 1 on the CPU from 0.64x to 1.3x a generation's in two runs of issue
    23's round 26), so only its shape across K is used."""
    both = [own[k] / grid[k] for k in own if grid.get(k)]
    return statistics.median(both) if both else 1.0


def spells(records: Iterable[dict]) -> Iterator[tuple[int, int, dict]]:
    """Each decode step of a trace as (K, steps since the change to that K or the last prefill, the
    step's record): 0 for the first step after a change or a prefill."""
    previous, since = None, 0
    for r in records:
        if r.get("kind") == "prefill":
            previous = None
        elif r.get("kind") == "step":
            k = int(r["k"])
            since = since + 1 if k == previous else 0
            previous = k
            yield k, since, r


def in_situ(records: list[dict]) -> InSitu | None:
    """The run's own step times (None for a run without decode steps)."""
    steps = [r for r in records if r.get("kind") == "step"]
    if not steps:
        return None
    by_k: dict[int, list[float]] = {}
    after_change: dict[int, int] = {}
    for k, since, step in spells(records):
        by_k.setdefault(k, []).append(float(step["verify_s"]))
        if since < AFTER_CHANGE:
            after_change[k] = after_change.get(k, 0) + 1
    host = [float(s.get("host_s", 0.0)) for s in steps]
    gaps = [float(s.get("host_s", 0.0)) + float(s.get("propose_s", 0.0)) for s in steps]
    return InSitu(int(steps[0].get("batch", 1)), {k: statistics.fmean(v) for k, v in by_k.items()},
                  {k: len(v) for k, v in by_k.items()}, sum(host) / len(host), statistics.median(gaps),
                  after_change)
