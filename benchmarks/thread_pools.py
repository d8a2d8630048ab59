"""Decode-step latency with one process-wide ORT thread pool vs a pool per session.

ORT fixes the choice per process, so each pool setup runs in its own child process. In each,
the recipe's program is opened at every batch size and one verify call per K is timed in three
patterns: K=0 repeated (no-spec), K=7 repeated (fixed K), and K=0/K=7 alternating (what varK
does when proposals come and go). Medians over ``--iters`` calls.

    python benchmarks/thread_pools.py recipes/tinycode_varK.yaml --batch-sizes 1,8
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

PATTERNS = {"K=0 repeated": [0], "K=max repeated": [-1], "K=0/K=max alternating": [0, -1]}


def child(recipe: str, batch_sizes: list[int], iters: int, shared: bool) -> dict:
    import spdflow_ort.session as ort_session

    if not shared:
        ort_session.shared_pool = lambda threads: False
    from spdflow.bench import BatchBench, compile_k_list
    from spdflow.engine.run import NullUI
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe

    pm = get_plugin_manager()
    loaded = load_recipe(recipe, pm)
    ks = compile_k_list(loaded.recipe)
    out = {}
    for b in batch_sizes:
        bench = BatchBench(pm, loaded, b, NullUI())
        bench.open()

        def run(k: int) -> float:
            ids = np.full((b, k + 1), 5, dtype=np.int64)
            pos = np.tile(np.arange(200, 201 + k, dtype=np.int64), (b, 1))
            start = time.perf_counter()
            pm.hook.spdflow_verify(session=bench.session, input_ids=ids, position_ids=pos,
                                   num_logits_to_keep=k + 1, batch_index=None)
            return time.perf_counter() - start

        for _ in range(20):
            for k in ks:
                run(k)
        for name, pattern in PATTERNS.items():
            times: dict[int, list[float]] = {}
            for i in range(iters):
                k = ks[pattern[i % len(pattern)]]
                times.setdefault(k, []).append(run(k))
            out[f"{b}|{name}"] = {str(k): statistics.median(v) * 1e3 for k, v in times.items()}
        bench.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--iters", type=int, default=400)
    parser.add_argument("--child", choices=["shared", "per-session"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.child:
        print(json.dumps(child(args.recipe, sizes, args.iters, args.child == "shared")))
        return
    results = {}
    for setup in ("per-session", "shared"):
        done = subprocess.run([sys.executable, __file__, args.recipe, "--batch-sizes", args.batch_sizes,
                               "--iters", str(args.iters), "--child", setup],
                              check=True, capture_output=True, text=True)
        results[setup] = json.loads(done.stdout.strip().splitlines()[-1])
    print("| batch | pattern | per-session pools, ms | shared pool, ms | speed-up |")
    print("|---|---|---|---|---|")
    for key in results["shared"]:
        b, name = key.split("|")
        for k in results["shared"][key]:
            a, s = results["per-session"][key][k], results["shared"][key][k]
            print(f"| {b} | {name}: K={k} | {a:.2f} | {s:.2f} | {a / s:.2f}× |")


if __name__ == "__main__":
    main()
