"""Round 28's rule R8: the bench's priced regret with the K prices and switch cost taken two ways, beside what was
measured. (As run in round 28 it walked the traces itself; it now reads them with spdflow.costs.spells.)

A bench-style run (benchmarks/policy_time.py's harness: one program, interleaved modes) of the given modes at one
batch size, then the oracle of the run (as `spdflow bench` computes it) priced by `MeasuredSteps` (every step's mean
per K, the grid's switch) and by `Settled` (each K at its settled steps' mean, a change at the mean excess of the
steps before settling). Per policy: the median over repeats of each pricing's regret against the best static choice,
and the measured paired ratio (the policy's tok/s over that static mode's in the same repeat, minus 1). From the
repository root:
    python benchmarks/results/k_policy_r28_tried/settled_prices.py recipes/tinycode_varK.yaml --batch 1 --repeats 4 \\
        --set workload.count=16 --set workload.builtin=stdlib_tests"""
import argparse
import statistics
import sys

SETTLE = 4  # steps after a change or a prefill before a step is settled


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("recipe")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--modes", default="nospec,fixed:all,goodput,smallest_covering")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)

    from spdflow.api import CostModel
    from spdflow.bench import BatchBench, compile_k_list, resolve_modes, run_order
    from spdflow.costs import MIN_STEPS, level_scale, measure_grid
    from spdflow.costs import spells as spell_steps
    from spdflow.engine.run import NullUI
    from spdflow.oracle import MeasuredSteps, trace_oracle
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe

    class Settled(CostModel):
        name = "settled steps"

        def __init__(self, batch, traces, grid):
            # (k, index in its spell, verify_s) per step; a spell starts at a change of K or a prefill
            spells = [(k, index, float(r["verify_s"])) for records in traces for k, index, r in spell_steps(records)]
            settled, every = {}, {}
            for k, index, v in spells:
                every.setdefault(k, []).append(v)
                if index >= SETTLE:
                    settled.setdefault(k, []).append(v)
            self.own = {k: statistics.fmean(settled[k]) if len(settled.get(k, ())) >= MIN_STEPS else statistics.fmean(v)
                        for k, v in every.items() if len(v) >= MIN_STEPS}
            self.grid, self.scale = grid, level_scale(self.own, grid.verify_s)
            excess, tails = 0.0, 0
            for k, index, v in spells:
                if index == 0:
                    tails += 1
                if index < SETTLE and k in self.own:
                    excess += v - self.own[k]
            self.switch = max(0.0, excess / tails) if tails >= MIN_STEPS else grid.switch_s * self.scale

        def verify_s(self, batch, k):
            return self.own[k] if k in self.own else self.grid.verify_s[k] * self.scale

        def switch_s(self, batch):
            return self.switch

        def describe(self):
            return {"cost_model": self.name, "switch_ms": round(self.switch * 1e3, 4)}

    pm = get_plugin_manager()
    loaded = load_recipe(args.recipe, pm, args.overrides)
    modes = {m.row: m for m in resolve_modes(pm, args.modes.split(","), loaded.recipe)}
    bench = BatchBench(pm, loaded, args.batch, NullUI())
    runs = []
    try:
        bench.open()
        bench.warm_up()
        from spdflow.bench import reference_tokens
        reference_tokens(bench)
        for repeat, row in run_order(list(modes), args.repeats):
            runs.append((repeat, row, bench.run(modes[row], repeat)))
            print(f"  repeat {repeat} {row}: {runs[-1][2].metrics.e2e_tokens_per_s:.0f} tok/s", file=sys.stderr, flush=True)
        config, ks = bench.config, compile_k_list(bench.recipe)
        traces = [run.records for _, _, run in runs]
        gaps = [float(s.get("host_s", 0.0)) + float(s.get("propose_s", 0.0)) for t in traces for s in t
                if s.get("kind") == "step"]
        grid = measure_grid(pm, bench.session, bench.batch_size, ks, config.pad_token_id, config.prefill_seq_len,
                            config.full_batch_size is not None, gap_s=statistics.median(gaps) if gaps else 0.0)
        oracles = {}
        for name, cost in (("old", MeasuredSteps(bench.batch_size, traces, grid)), ("new", Settled(bench.batch_size, traces, grid))):
            oracles[name] = trace_oracle(pm, bench.engine, bench.info, bench.requests, bench.baseline, ks,
                                         bench.batch_size, config.full_batch_size is not None, traces, cost)
    finally:
        bench.close()
    tok = {(repeat, row): run.metrics.e2e_tokens_per_s for repeat, row, run in runs}
    statics = [row for row in modes if row == "nospec" or row.startswith("fixed:")]
    best = max(statics, key=lambda row: statistics.median(tok[(r, row)] for r in range(args.repeats)))
    for name, oracle in oracles.items():
        print(f"{name}: {oracle.cost.describe()}; best static priced {oracle.best_static}")
    print(f"batch {args.batch}, {args.repeats} repeats; best static measured: {best}")
    print("| policy | priced regret, old | priced regret, new | measured paired - 1 |")
    print("|---|---|---|---|")
    for row in modes:
        if row in statics:
            continue
        figures = {name: statistics.median(o.against(run.records)["regret_vs_best_static"] for _, r, run in runs if r == row)
                   for name, o in oracles.items()}
        paired = statistics.median(tok[(r, row)] / tok[(r, best)] for r in range(args.repeats)) - 1
        print(f"| {row} | {figures['old'] * 100:+.1f} % | {figures['new'] * 100:+.1f} % | {paired * 100:+.1f} % |")
    old = oracles["old"]
    print("\nper run, the median over repeats of (measured - priced by the old prices) as a share of the measured run")
    print("| mode | verify | host + proposer | switches a run |")
    print("|---|---|---|---|")
    for row in modes:
        shares = {"verify": [], "host": [], "changes": []}
        for _, r, run in runs:
            if r != row:
                continue
            steps = [s for s in run.records if s.get("kind") == "step"]
            wall = run.metrics.wall_s
            priced_verify = priced_host = 0.0
            previous = None
            for rec in run.records:
                if rec.get("kind") == "prefill":
                    previous = None
                elif rec.get("kind") == "step":
                    k = int(rec["k"])
                    priced_verify += old.cost.verify_s(args.batch, k) + (old.prices.switch if k != previous else 0.0)
                    priced_host += old.prices.step[k] - old.cost.verify_s(args.batch, k)
                    previous = k
            shares["verify"].append((sum(float(s["verify_s"]) for s in steps) - priced_verify) / wall)
            shares["host"].append((sum(float(s["host_s"]) + float(s["propose_s"]) for s in steps) - priced_host) / wall)
            shares["changes"].append(sum(1 for a, b in zip(steps, steps[1:]) if a["k"] != b["k"]))
        print(f"| {row} | {statistics.median(shares['verify']) * 100:+.1f} % | {statistics.median(shares['host']) * 100:+.1f} % "
              f"| {statistics.median(shares['changes']):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
