"""Does the K policy's starting grid of step costs agree with what generations measure?

goodput starts from :func:`spdflow.engine.generate.measure_step_costs`: every compiled K timed
in short blocks (some untimed warm-up runs, then a few timed ones, the K order rotating over
rounds). This script puts grids of several block shapes beside the verify time that fixed-K
generations actually see, on one bench session per batch size: per trial it times each grid,
then runs no-spec and every fixed K once (the order alternating per trial) and takes the median
verify time per K over each generation's steps after the fifth. It reports, per batch size and
grid, the median over trials of the grid's K = 0 ÷ the generations' K = 0, and of each K's
ratio to K = 0 in the grid ÷ the same ratio in the generations (1.00: the grid prices the
choice between K and K = 0 as generations pay it).

    python benchmarks/step_cost_grid.py recipes/tinycode_varK.yaml --batch-sizes 1,2,4,8 --trials 3 --grids 1x2,4x3
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SKIP_STEPS = 5  # a generation's first steps follow prefill and a change of shape


def parse_grids(text: str) -> list[tuple[int, int]]:
    """``"1x2,4x3"`` -> [(1, 2), (4, 3)]: (untimed warm-up runs, timed runs) per block."""
    grids = []
    for item in text.split(","):
        warmup, _, repeats = item.strip().partition("x")
        if not (warmup.isdigit() and repeats.isdigit() and int(repeats) > 0):
            raise ValueError(f"--grids item {item!r} is not WARMUPxTIMED, e.g. 4x3")
        grids.append((int(warmup), int(repeats)))
    return grids


def measure(recipe: str, batch: int, trials: int, grids: list[tuple[int, int]], rounds: int,
            overrides: list[str]) -> list[dict]:
    """Per trial: {"grids": {"WxR": {k: s}}, "seconds": {"WxR": s}, "generations": {k: s}} on one
    bench session ("seconds": how long timing that grid took)."""
    from spdflow.bench import BatchBench, resolve_modes
    from spdflow.engine.generate import measure_step_costs
    from spdflow.engine.run import NullUI
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe

    pm = get_plugin_manager()
    loaded = load_recipe(recipe, pm, overrides)
    bench = BatchBench(pm, loaded, batch, NullUI())
    bench.open()
    try:
        bench.warm_up()
        modes = {mode.k or 0: mode for mode in resolve_modes(pm, ["nospec", "fixed:all"], loaded.recipe)}
        ks = sorted(modes)
        out = []
        for trial in range(trials):
            timed, seconds = {}, {}
            for w, r in grids:
                started = time.perf_counter()
                timed[f"{w}x{r}"] = measure_step_costs(pm, bench.session, batch, ks, bench.config.pad_token_id,
                                                       rounds=rounds, warmup=w, repeats=r)
                seconds[f"{w}x{r}"] = time.perf_counter() - started
            generations = {}
            for k in ks if trial % 2 == 0 else ks[::-1]:
                run = bench.run(modes[k], trial)
                steps = [r["verify_s"] for r in run.records if r.get("kind") == "step"]
                generations[k] = statistics.median(steps[SKIP_STEPS:] or steps)
            out.append({"grids": timed, "seconds": seconds, "generations": generations})
            print(f"  batch {batch} trial {trial + 1}/{trials} done", file=sys.stderr, flush=True)
        return out
    finally:
        bench.close()


def summarize(trials: list[dict]) -> dict[str, dict]:
    """Per grid: median over trials of K=0 (grid ÷ generations), of each K's ratio-of-ratios and of
    the seconds the grid took."""
    names = list(trials[0]["grids"])
    ks = sorted(trials[0]["generations"])
    summary = {}
    for name in names:
        base = [t["grids"][name][0] / t["generations"][0] for t in trials]
        ratios = {k: [(t["grids"][name][k] / t["grids"][name][0]) / (t["generations"][k] / t["generations"][0])
                      for t in trials] for k in ks if k}
        summary[name] = {"k0": statistics.median(base),
                         "ratio": {k: statistics.median(v) for k, v in ratios.items()},
                         "seconds": statistics.median(t["seconds"][name] for t in trials)}
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--trials", type=int, default=3, help="grids + generations per batch size (default 3)")
    parser.add_argument("--grids", default="1x2,4x3", help="block shapes WARMUPxTIMED (default 1x2,4x3)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per grid (default 4, as the policy's)")
    parser.add_argument("--json", type=Path, help="write every trial's figures here")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        grids = parse_grids(args.grids)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        parser.error("--batch-sizes must be positive integers, e.g. 1,2,4,8")
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    results = {}
    for batch in sizes:
        results[batch] = measure(args.recipe, batch, args.trials, grids, args.rounds, args.overrides)
    ks = sorted(results[sizes[0]][0]["generations"])
    print("| batch | grid (warm-up x timed) | seconds to time it | K=0: grid ÷ generations | "
          + " | ".join(f"K={k}/K=0: grid ÷ generations" for k in ks if k) + " |")
    print("|---|---|---|---|" + "---|" * (len(ks) - 1))
    for batch in sizes:
        for name, row in summarize(results[batch]).items():
            print(f"| {batch} | {name} | {row['seconds']:.2f} | {row['k0']:.2f} | " + " | ".join(f"{row['ratio'][k]:.2f}" for k in ks if k) + " |")
    if args.json:
        args.json.write_text(json.dumps({str(b): t for b, t in results.items()}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
