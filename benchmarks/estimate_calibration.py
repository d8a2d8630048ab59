"""Issue 23: how goodput's acceptance estimates compare with what the rows then accepted.

Replays recorded runs (``k_policy_replay.py --make-runs``) under goodput as
``k_policy_replay.py`` runs it (the recorded run's mean host and proposer time, one noise seed)
and, at every step where goodput chose a K > 0 with its estimate settled, notes for each row that
proposed: the accepted proposals goodput expected at that K (its own estimate: the request's
rates, scaled by the request's last outcome from ``outcome_batch`` rows up, or by its proposal's
grade), what the pooled estimate alone would have expected, and what the row then accepted.
Prints one table per run and batch size, by K and by the row's last outcome; the same by the
proposal's grade (prompt lookup: the matched n-gram's length), with how far every scored
proposal of that grade held; and, by quarter of each request's scored proposals in order, how
far they held (prompt lookup copies more as a request goes on).

    python benchmarks/estimate_calibration.py --runs RUNS_DIR --batch-sizes 1,8
"""
from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import k_policy_replay  # noqa: E402

OUTCOME_NAMES = {None: "none yet / not read", 0: "missed", 1: "held in part", 2: "held whole"}


def recording_policy(settings: dict):
    """The replay's goodput, noting (K, per row: own and pooled expectation, proposal length,
    last outcome, grade) at each choice and the rows' accepted counts when that step is observed."""
    _, steady = k_policy_replay.steady_plugin(settings)
    log: list[tuple[int, list[tuple[float, float, int, int | None, int | None]], tuple[int, ...]]] = []
    #: (request, checked, matched, grade) of every scored proposal, in order
    scored: list[tuple[int, int, int, int | None]] = []

    class Recording(steady):
        def choose_k(self, proposal_counts, compiled_ks):
            k = super().choose_k(proposal_counts, compiled_ks)
            self._noted = None
            if k > 0 and any(proposal_counts) and self._settled:
                own = len(self.requests) == len(proposal_counts)
                requests = self.requests if own else [None] * len(proposal_counts)
                grades = self.row_grades(len(proposal_counts)) or (None,) * len(proposal_counts)
                extras = self.acceptance.row_extras(requests, grades)
                pooled = self.acceptance.expected_extra()
                last = self.acceptance.last if self.acceptance.by_outcome else {}
                self._noted = (k, [(extra[min(n, k)], pooled[min(n, k)], n, last.get(r), g)
                                   for extra, n, r, g in zip(extras, proposal_counts, requests, grades)])
            return k

        def observe(self, outcome):
            noted = getattr(self, "_noted", None)
            if noted is not None and noted[0] == outcome.k:
                log.append((noted[0], noted[1], tuple(outcome.accepted)))
            self._noted = None
            grades = outcome.scored_grades or (None,) * len(outcome.scored)
            scored.extend((request, checked, matched, grade) for request, (checked, matched), grade
                          in zip(outcome.scored_requests, outcome.scored, grades))
            super().observe(outcome)

    from spdflow.hookspecs import hookimpl
    from spdflow_decoding import GoodputConfig

    class Plugin:
        @hookimpl
        def spdflow_register_k_policies(self, register):
            register(Recording.name, lambda: Recording(GoodputConfig(**settings)),
                     description="goodput noting its expectations (calibration harness)")

    return Plugin(), Recording, log, scored


def tally(log, by: str = "outcome") -> dict[tuple[int, int | None], list[float]]:
    """Per (K, last outcome), or per (K, grade) with ``by="grade"``: [rows, expected (own),
    expected (pooled), accepted], summed over rows that proposed."""
    cells: dict[tuple[int, int | None], list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0])
    for k, rows, accepted in log:
        for (own, pooled, n, outcome, grade), got in zip(rows, accepted):
            if n:
                cell = cells[(k, grade if by == "grade" else outcome)]
                cell[0] += 1
                cell[1] += own
                cell[2] += pooled
                cell[3] += got
    return dict(cells)


def by_quarter(scored) -> list[tuple[int, float, float]]:
    """Per quarter of each request's scored proposals (in order): proposals, mean positions held,
    and the share whose first position held."""
    mine: dict[int, list[int]] = defaultdict(list)
    for request, _, matched, _ in scored:
        mine[request].append(matched)
    quarters: list[list[int]] = [[], [], [], []]
    for held in mine.values():
        for i, matched in enumerate(held):
            quarters[4 * i // len(held)].append(matched)
    return [(len(q), sum(q) / len(q) if q else 0.0, sum(m > 0 for m in q) / len(q) if q else 0.0) for q in quarters]


def by_grade(scored) -> dict[int | None, tuple[int, float, float]]:
    """Per grade: scored proposals, mean positions held, and the share whose first position held."""
    held: dict[int | None, list[int]] = defaultdict(list)
    for _, _, matched, grade in scored:
        held[grade].append(matched)
    return {grade: (len(m), sum(m) / len(m), sum(x > 0 for x in m) / len(m))
            for grade, m in sorted(held.items(), key=lambda item: str(item[0]))}


def render(cells: dict, by: str = "outcome") -> str:
    column = "row's last outcome" if by == "outcome" else "proposal's grade"
    lines = [f"| K | {column} | rows | expected (goodput) | expected (pooled alone) | accepted | accepted ÷ goodput's |",
             "|---|---|---|---|---|---|---|"]
    for (k, key), (rows, own, pooled, got) in sorted(cells.items(), key=lambda c: (c[0][0], str(c[0][1]))):
        ratio = f"{got / own:.2f}" if own else "—"
        name = OUTCOME_NAMES.get(key, key) if by == "outcome" else ("none" if key is None else key)
        lines.append(f"| {k} | {name} | {rows} | {own / rows:.2f} | {pooled / rows:.2f} | "
                     f"{got / rows:.2f} | {ratio} |")
    return "\n".join(lines)


def calibrate(runs: Path, batch_sizes: list[int], settings: dict, noise: float = 0.2, seed: int = 1) -> dict:
    """{run name: {batch: {"cells": tally, "graded": tally by grade, "quarters": by_quarter,
    "grades": by_grade}}} for every recorded run under ``runs``."""
    from spdflow import whatif as wi
    from spdflow.plugins import get_plugin_manager

    pm = get_plugin_manager()
    plugin, recording, log, scored = recording_policy(settings)
    pm.add_plugin(plugin, "estimate-calibration", version="1.0")
    out: dict = {}
    for run_dir in sorted(p for p in runs.iterdir() if (p / "trace.jsonl").exists()):
        run, cost = k_policy_replay.load_for_replay(pm, run_dir, recording, noise)
        ks = tuple(sorted(set(run.recipe.k_list()) | {0}))
        for batch in batch_sizes:
            log.clear()
            scored.clear()
            recording.rng = random.Random(f"{run_dir.name}:{batch}:{seed}")
            wi.replay(pm, run, wi.Scenario(ks, recording.name, batch), cost)
            out.setdefault(run_dir.name, {})[batch] = {"cells": tally(log), "graded": tally(log, "grade"),
                                                       "quarters": by_quarter(scored), "grades": by_grade(scored)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, required=True, help="recorded runs (k_policy_replay.py --make-runs)")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a goodput setting (with: field), repeatable")
    parser.add_argument("--seed", type=int, default=1, help="noise seed of the fed timings (default 1)")
    args = parser.parse_args(argv)
    import yaml

    settings = {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.settings)}
    results = calibrate(args.runs, [int(b) for b in args.batch_sizes.split(",")], settings, seed=args.seed)
    for name, by_batch in results.items():
        for batch, found in by_batch.items():
            print(f"\n{name}, batch {batch}:\n")
            print(render(found["cells"]))
            print()
            print(render(found["graded"], "grade"))
            grades = ", ".join(f"{'none' if g is None else g}: {n} held {mean:.2f} (first {first:.2f})"
                               for g, (n, mean, first) in found["grades"].items())
            print(f"\nEvery scored proposal by grade (proposals, mean positions held, share whose first held): {grades}")
            quarters = ", ".join(f"{n} held {mean:.2f} (first {first:.2f})" for n, mean, first in found["quarters"])
            print(f"\nEach request's scored proposals by quarter, in order (proposals, mean positions held, "
                  f"share whose first held): {quarters}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
