"""Does a request's last proposal predict its next one? (issue 23, round 15)

For each recorded run (``k_policy_replay.py --make-runs``), each request's path is walked at a
fixed K as a fixed-K generation would take it: at every step the proposer's proposal (budget K,
made over the recorded output, as ``spdflow whatif --oracle`` makes it) holds for its first m
tokens and the step emits min(m, K) + 1. Each step is counted under how the step before it fared:
its proposal missed its first token, held in part, or held whole (all K). Printed per workload:
the share of proposals whose first token held and the mean tokens accepted, after each outcome.

    python benchmarks/proposal_spells.py RUNS [--k 7] [--workloads code,rare]

No timing: the figures depend only on the recorded outputs and the proposer.
"""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

OUTCOMES = ("missed", "in part", "whole")


def spells(pm, run_dir: Path, k: int) -> dict:
    """{outcome: (steps, share whose first token held, mean accepted)} along fixed-K paths."""
    from spdflow import whatif as wi
    from spdflow.engine.run import Engine, NullUI, RunOptions
    from spdflow.oracle import lengths_for

    run = wi.load_run(run_dir, pm)
    engine = Engine(pm, run.loaded, RunOptions(), NullUI())
    try:
        lengths, _, _ = lengths_for(pm, engine, run.model_info, run.requests, run.outputs, [k])
    finally:
        engine.close_sessions()
    steps, held, accepted = Counter(), Counter(), Counter()
    for request in run.requests:
        m, n = lengths[request.index][k], len(run.outputs[request.index])
        point, last = 1, None
        while point < n:
            got = min(int(m[point]) if point < len(m) else 0, k)
            if last is not None:
                outcome = OUTCOMES[0] if last == 0 else OUTCOMES[2] if last == k else OUTCOMES[1]
                steps[outcome] += 1
                held[outcome] += got > 0
                accepted[outcome] += got
            last, point = got, point + got + 1
    return {o: (steps[o], held[o] / steps[o], accepted[o] / steps[o]) for o in OUTCOMES if steps[o]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="a directory of recorded runs (k_policy_replay.py --make-runs)")
    parser.add_argument("--k", type=int, default=7, help="the fixed K of the walk (default 7)")
    parser.add_argument("--workloads", default="", help="comma-separated (default: every run in RUNS)")
    args = parser.parse_args()
    from spdflow.plugins import get_plugin_manager

    pm = get_plugin_manager()
    names = args.workloads.split(",") if args.workloads else sorted(
        p.name for p in args.runs.iterdir() if (p / "trace.jsonl").exists())
    print(f"| workload | {' | '.join(f'after {o}: steps, first held, mean accepted' for o in OUTCOMES)} |")
    print("|---|" + "---|" * len(OUTCOMES))
    for name in names:
        figures = spells(pm, args.runs / name, args.k)
        cells = [f"{figures[o][0]}, {figures[o][1]:.2f}, {figures[o][2]:.2f}" if o in figures else "-" for o in OUTCOMES]
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
