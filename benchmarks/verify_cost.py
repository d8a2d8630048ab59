"""What one verify step costs per (batch size, K) on a recipe's compiled program.

The ceiling on any SpD speedup: a step at K returns on average AL tokens and costs
cost(K) / cost(0) no-spec steps, so the decode speedup is at most AL · cost(0) / cost(K).
Sessions for every batch size are open at once and calls are interleaved round-robin, so drift
hits every cell alike; medians over ``--iters`` calls.

    python benchmarks/verify_cost.py recipes/tinycode_varK.yaml --batch-sizes 1,2,4,8
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def measure(recipe: str, batch_sizes: list[int], iters: int, overrides: list[str]) -> dict[tuple[int, int], float]:
    """Median seconds of one verify call per (batch size, K), K over the recipe's K-list plus 0."""
    from spdflow.bench import BatchBench, compile_k_list
    from spdflow.engine.run import NullUI
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe

    pm = get_plugin_manager()
    loaded = load_recipe(recipe, pm, overrides)
    benches = {}
    for b in batch_sizes:
        benches[b] = BatchBench(pm, loaded, b, NullUI())
        benches[b].open()
    ks = compile_k_list(loaded.recipe)
    times: dict[tuple[int, int], list[float]] = {(b, k): [] for b in batch_sizes for k in ks}
    for _ in range(iters):
        for b, bench in benches.items():
            for k in ks:
                ids = np.full((b, k + 1), 5, dtype=np.int64)
                pos = np.tile(np.arange(100, 101 + k, dtype=np.int64), (b, 1))
                start = time.perf_counter()
                pm.hook.spdflow_verify(session=bench.session, input_ids=ids, position_ids=pos,
                                       num_logits_to_keep=k + 1, batch_index=None)
                times[(b, k)].append(time.perf_counter() - start)
    for bench in benches.values():
        bench.close()
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    medians = measure(args.recipe, sizes, args.iters, args.overrides)
    ks = sorted({k for _, k in medians})
    print("| batch | " + " | ".join(f"K={k} ms" for k in ks) + " | " + " | ".join(f"K={k}/K=0" for k in ks[1:]) + " |")
    print("|" + "---|" * (1 + 2 * len(ks) - 1))
    for b in sizes:
        base = medians[(b, 0)]
        print(f"| {b} | " + " | ".join(f"{medians[(b, k)] * 1e3:.2f}" for k in ks) + " | "
              + " | ".join(f"{medians[(b, k)] / base:.2f}" for k in ks[1:]) + " |")


if __name__ == "__main__":
    main()
