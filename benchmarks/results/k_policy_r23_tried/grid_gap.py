"""Round 23 of issue 23: goodput's start grid timed with no gap, a spinning gap and a memory-touching gap
after each verify run, against the mean verify time of fixed-K generations in the same session.

    python benchmarks/results/k_policy_r23_tried/grid_gap.py BATCH ROUNDS   # from the repository root

Prints each round's K = 2 / K = 0, K = 4 / K = 2 and K = 7 / K = 4 ratios, then their medians and ranges.
"""
import sys, time, statistics
import numpy as np
from spdflow.bench import BatchBench, resolve_modes
from spdflow.engine.run import NullUI
from spdflow.plugins import get_plugin_manager
from spdflow.recipe.loader import load_recipe
batch, n = int(sys.argv[1]), int(sys.argv[2])
pm = get_plugin_manager()
loaded = load_recipe("recipes/tinycode_varK.yaml", pm, ["workload.count=16", "proposer={uses: synthetic, with: {acceptance_rate: 0.6}}"])
modes = {m.row: m for m in resolve_modes(pm, ["nospec", "fixed:all"], loaded.recipe)}
bench = BatchBench(pm, loaded, batch, NullUI()); bench.open(); bench.warm_up()
ks = [0, 2, 4, 7]
pad = bench.config.pad_token_id
buf = np.zeros(1 << 17)  # 1 MB of float64

def spin(g):
    end = time.perf_counter() + g
    while time.perf_counter() < end:
        pass

def pollute(g):
    end = time.perf_counter() + g
    while time.perf_counter() < end:
        np.add(buf, 1.0, out=buf)

def grid(gapfn, g, rounds=4, warmup=4, repeats=3):
    times = {k: [] for k in ks}
    for r in range(rounds):
        for k in ks[r % 4:] + ks[:r % 4]:
            for i in range(warmup + repeats):
                ids = np.full((batch, k + 1), pad, dtype=np.int64)
                pos = np.full((batch, k + 1), -1, dtype=np.int64)
                s = time.perf_counter()
                pm.hook.spdflow_verify(session=bench.session, input_ids=ids, position_ids=pos, num_logits_to_keep=k + 1, batch_index=None)
                e = time.perf_counter()
                if i >= warmup:
                    times[k].append(e - s)
                if gapfn:
                    gapfn(g)
    return {k: float(np.median(v)) for k, v in times.items()}

rat = lambda c: (c[2] / c[0], c[4] / c[2], c[7] / c[4])
rows = {"nogap": [], "spin": [], "pollute": [], "gen": []}
g = 0.0002
for i in range(n):
    for name, fn in (("nogap", None), ("spin", spin), ("pollute", pollute)):
        rows[name].append(rat(grid(fn, g)))
    gen, gaps = {}, []
    for row, mode in modes.items():
        run = bench.run(mode, i)
        steps = [r for r in run.records if r.get("kind") == "step"]
        gen[int(row.split(":")[1]) if ":" in row else 0] = statistics.fmean(r["verify_s"] for r in steps)
        gaps += [float(r.get("host_s", 0.0)) + float(r.get("propose_s", 0.0)) for r in steps]
    rows["gen"].append(rat(gen))
    g = statistics.median(gaps)
    print(i, f"gap {g*1e6:.0f}us", {k: " ".join(f"{x:.3f}" for x in v[-1]) for k, v in rows.items()}, flush=True)
for k, v in rows.items():
    cols = list(zip(*v))
    print(f"b{batch}", k, "  ".join(f"{name} {statistics.median(c):.3f} ({min(c):.3f}-{max(c):.3f})"
                      for name, c in zip(("2/0", "4/2", "7/4"), cols)), flush=True)
bench.close()
