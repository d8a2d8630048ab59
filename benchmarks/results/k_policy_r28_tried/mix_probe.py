"""Round 28's rule R4: what each K's verify runs cost inside a run that mixes Ks, against a run of that K alone.

Bench-style interleaved runs (the harness of benchmarks/policy_time.py: one program, same warm-up, rotating order) of
the given modes; per mode and K, the median verify time of a step (ms), split into the first step after a change of K
("first") and the others ("steady"), and each run's steady median paired with fixed:<K>'s median in the same repeat
(the median over repeats of the ratio). From the repository root:
    python benchmarks/results/k_policy_r28_tried/mix_probe.py recipes/tinycode_varK.yaml --batch 1 --repeats 8 \\
        --modes fixed:2,fixed:4,fixed:7,smallest_covering,goodput --set workload.count=16 --set workload.builtin=stdlib_tests"""
import argparse
import statistics
import sys
from collections import defaultdict


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--modes", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)

    from spdflow.bench import BatchBench, resolve_modes, run_order
    from spdflow.engine.run import NullUI
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe

    pm = get_plugin_manager()
    loaded = load_recipe(args.recipe, pm, args.overrides)
    modes = {m.row: m for m in resolve_modes(pm, args.modes.split(","), loaded.recipe)}
    bench = BatchBench(pm, loaded, args.batch, NullUI())
    # per mode, per repeat: {(k, "first"|"steady"): [verify s]}, and tok/s
    runs: dict[str, dict[int, dict]] = defaultdict(dict)
    toks: dict[str, dict[int, float]] = defaultdict(dict)
    parts: dict[str, dict[int, dict[str, float]]] = defaultdict(dict)  # per run: ms of verify, host, propose, the rest
    try:
        bench.open()
        bench.warm_up()
        for repeat, row in run_order(list(modes), args.repeats):
            run = bench.run(modes[row], repeat)
            times, last = defaultdict(list), None
            for record in run.records:
                if record.get("kind") != "step":
                    continue
                k = int(record["k"])
                times[(k, "steady" if k == last else "first")].append(float(record["verify_s"]))
                last = k
            runs[row][repeat] = times
            steps = [r for r in run.records if r.get("kind") == "step"]
            split = {part: sum(float(r[part + "_s"]) for r in steps) * 1e3 for part in ("verify", "host", "propose")}
            split["steps"] = len(steps)
            split["switches"] = sum(1 for a, b in zip(steps, steps[1:]) if a["k"] != b["k"])
            split["run"] = run.metrics.wall_s * 1e3
            split["rest"] = split["run"] - split["verify"] - split["host"] - split["propose"]
            parts[row][repeat] = split
            toks[row][repeat] = run.metrics.e2e_tokens_per_s
            print(f"  repeat {repeat} {row}: {run.metrics.e2e_tokens_per_s:.0f} tok/s", file=sys.stderr, flush=True)
    finally:
        bench.close()
    ks = sorted({k for per in runs.values() for times in per.values() for (k, _) in times})
    print(f"batch {args.batch}, {args.repeats} repeats; verify ms per step, median over repeats of each run's median "
          "(steps a run in brackets); paired: median over repeats of the run's steady median / fixed:K's in the repeat")
    print("| mode | " + " | ".join(f"K={k} steady | K={k} first | K={k} paired" for k in ks) + " | tok/s |")
    print("|---" * (3 * len(ks) + 2) + "|")
    for row, per in runs.items():
        cells = []
        for k in ks:
            for part in ("steady", "first"):
                meds = [statistics.median(t[(k, part)]) * 1e3 for t in per.values() if t.get((k, part))]
                counts = [len(t.get((k, part), ())) for t in per.values()]
                cells.append(f"{statistics.median(meds):.3f} ({statistics.median(counts):.0f})" if meds else "—")
            own = f"fixed:{k}"
            ratios = [statistics.median(t[(k, "steady")]) / statistics.median(runs[own][r][(k, "steady")])
                      for r, t in per.items() if t.get((k, "steady")) and own in runs and runs[own][r].get((k, "steady"))]
            cells.append(f"{statistics.median(ratios):.3f}" if ratios and row != own else "—")
        cells.append(f"{statistics.median(toks[row].values()):.0f}")
        print(f"| {row} | " + " | ".join(cells) + " |")
    reference = next(iter(runs))
    print(f"\nper run, ms (median over repeats) and the median over repeats of its difference from {reference}'s in the "
          "same repeat")
    names = ("run", "verify", "host", "propose", "rest", "steps", "switches")
    print("| mode | " + " | ".join(names) + " | " + " | ".join(f"{n} - {reference}" for n in names[:5]) + " |")
    print("|---" * (len(names) + 6) + "|")
    for row, per in parts.items():
        cells = [f"{statistics.median(s[n] for s in per.values()):.1f}" for n in names]
        cells += [f"{statistics.median(s[n] - parts[reference][r][n] for r, s in per.items()):+.1f}" for n in names[:5]]
        print(f"| {row} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
