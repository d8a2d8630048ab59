"""What host time between verify runs costs a generation, beside what a K policy's steps cost.

A fixed-K mode runs with a busy-wait of D µs added to every step (after ``choose_k``, so on the
path between one verify run and the next, where a policy's own work lies), for each D of
``--delays``, interleaved with the given policies in a rotating order as ``spdflow bench`` runs
them (same warm-up). Per variant it prints, as medians over repeats: tok/s, tok/s paired with the
undelayed fixed mode in the same repeat, the median step's host gap (host + proposer time) and
the mean verify time of the steps of each K. So one run tells how much a step's extra host time
costs on this machine, whether it also slows the verify run that follows (a backend's worker
threads that stop spinning would), and where a policy's loss against the fixed K it mostly runs
comes from: its host time, or its verify steps. Exits 1 if any run's tokens differ from no-spec's.

    python benchmarks/host_gap.py recipes/tinycode_varK.yaml --batch 1 --repeats 6 --delays 0,100,300 \\
        --set workload.count=16 --set 'proposer={uses: synthetic, with: {acceptance_rate: 0.3}}'
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--fixed", default="fixed:2", help="the fixed-K mode delayed (default fixed:2)")
    parser.add_argument("--delays", default="0,100,300", help="µs added to each step of --fixed, comma-separated")
    parser.add_argument("--policies", default="goodput", help="bench modes run beside, undelayed, comma-separated")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        delays = [float(d) for d in args.delays.split(",") if d.strip()]
    except ValueError:
        parser.error(f"--delays {args.delays!r}: give µs as numbers, e.g. 0,100,300")
    if args.repeats < 1 or not delays or min(delays) < 0:
        parser.error("--repeats must be at least 1 and --delays non-negative numbers")

    import spdflow.engine.generate as generate
    from spdflow.bench import BatchBench, reference_tokens, resolve_modes, run_order
    from spdflow.engine.run import NullUI
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe

    pm = get_plugin_manager()
    loaded = load_recipe(args.recipe, pm, args.overrides)
    names = [args.fixed, *[p for p in args.policies.split(",") if p.strip()]]
    modes = {m.row: m for m in resolve_modes(pm, names, loaded.recipe)}
    fixed = next(iter(modes))
    if not fixed.startswith("fixed"):
        parser.error(f"--fixed {args.fixed!r} is not a fixed-K mode (e.g. fixed:2)")
    variants = [(fixed, d) for d in delays] + [(row, 0.0) for row in list(modes)[1:]]
    delay = [0.0]
    call_policy = generate.Generator._call_policy

    def delayed(self, method, *call_args):
        answer = call_policy(self, method, *call_args)
        if method == "choose_k" and delay[0] > 0:
            end = time.perf_counter() + delay[0]
            while time.perf_counter() < end:
                pass
        return answer

    results: dict[tuple[str, float], list[dict]] = defaultdict(list)
    bench = BatchBench(pm, loaded, args.batch, NullUI())
    generate.Generator._call_policy = delayed  # (undone in the finally below)
    try:
        bench.open()
        bench.warm_up()
        baseline = reference_tokens(bench)
        for repeat, (row, d) in run_order(variants, args.repeats):
            delay[0] = d * 1e-6
            try:
                run = bench.run(modes[row], repeat)
            finally:
                delay[0] = 0.0
            steps = [r for r in run.records if r.get("kind") == "step"]
            by_k = defaultdict(list)
            for step in steps:
                by_k[int(step["k"])].append(float(step["verify_s"]))
            gap = statistics.median(float(s["host_s"]) + float(s.get("propose_s", 0.0)) for s in steps) if steps else 0.0
            results[(row, d)].append({"tok/s": run.metrics.e2e_tokens_per_s, "gap": gap * 1e6,
                                      "verify": {k: statistics.mean(v) * 1e3 for k, v in by_k.items()},
                                      "steps": {k: len(v) for k, v in by_k.items()}, "same": run.tokens == baseline})
            print(f"  repeat {repeat} {row} +{d:.0f} µs: {run.metrics.e2e_tokens_per_s:.0f} tok/s", file=sys.stderr, flush=True)
    finally:
        generate.Generator._call_policy = call_policy
        bench.close()
    first = results[variants[0]]
    print(f"batch {args.batch}, {args.repeats} repeats; medians over repeats; paired: ÷ {fixed} +{delays[0]:.0f} µs "
          "in the same repeat")
    print("| variant | tok/s | paired | host gap µs (median step) | verify ms per step, by K | steps by K | tokens = no-spec |")
    print("|---|---|---|---|---|---|---|")
    for variant in variants:
        runs = results[variant]
        ks = sorted({k for r in runs for k in r["verify"]})
        verify = ", ".join(f"K={k}: {statistics.median(r['verify'][k] for r in runs if k in r['verify']):.3f}" for k in ks)
        steps = ", ".join(f"{k}: {statistics.median(r['steps'].get(k, 0) for r in runs):.0f}" for k in ks)
        paired = statistics.median(r["tok/s"] / f["tok/s"] for r, f in zip(runs, first))
        same = "yes" if all(r["same"] for r in runs) else "**no**"
        print(f"| {variant[0]} +{variant[1]:.0f} µs | {statistics.median(r['tok/s'] for r in runs):.0f} | {paired:.3f} | "
              f"{statistics.median(r['gap'] for r in runs):.0f} | {verify} | {steps} | {same} |")
    return 0 if all(r["same"] for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
