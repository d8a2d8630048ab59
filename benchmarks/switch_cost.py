"""What a change of decode shape (K) costs on the ONNX Runtime backend, static against dynamic sessions.

A varK schedule changes K between steps. On the CPU a static program is one ORT session per
specialization, each holding its own packed copy of the weights, so the first steps after a
change run on weights the other sessions pushed out of the cache; one dynamic session serves
every K from one copy. This times, per session mode and batch size, the verify call of each K:

* ``steady``: inside a block of 60 calls at that K (the first 10 not counted);
* ``switch``: the first call after a change of K, inside a random schedule (runs of 1-4 steps at
  a random K of the list, the same schedule in every process);
* ``after1``: the second call after a change; ``mixed steady``: later calls of a run.

Each (session mode, batch size) runs in a process of its own (``--rounds`` times, alternating the
modes), because a process's speed varies: figures are medians per process, then the median
and range over processes.

    python benchmarks/switch_cost.py recipes/tinycode_varK.yaml --batch-sizes 1,4,8 --rounds 2
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys

KINDS = ("steady", "switch", "after1", "mixed steady")


def child(recipe: str, batch: int, mode: str, overrides: list[str]) -> dict:
    """One process: per kind and K, the median seconds of a verify call (timed by spdflow.costs,
    as the oracle's grid and the engine's step costs are)."""
    from spdflow.bench import BatchBench, compile_k_list
    from spdflow.costs import _time_runs, time_round
    from spdflow.engine.run import NullUI
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe

    pm = get_plugin_manager()
    loaded = load_recipe(recipe, pm, [*overrides, f"devices.with.session_mode={mode}"])
    bench = BatchBench(pm, loaded, batch, NullUI())
    bench.open()
    ks, pad = compile_k_list(loaded.recipe), bench.config.pad_token_id
    times: dict[tuple[str, int], list[float]] = {}
    rng = random.Random(0)
    for round_ in range(6):
        for k, timed in time_round(pm, bench.session, batch, ks, pad, None, round_, warmup=10, repeats=50).items():
            times.setdefault(("steady", k), []).extend(timed)
        # runs of 1-4 steps at a random K; each call labelled by its place after the last change
        schedule, kinds, last = [], [], None
        for _ in range(300):
            k = rng.choice(ks)
            for j in range(rng.randint(1, 4)):
                schedule.append(k)
                kinds.append("switch" if k != last else ("after1" if j == 1 else "mixed steady"))
                last = k
        took = _time_runs(pm, bench.session, [(batch, k + 1, k + 1) for k in schedule], pad, None)
        for kind, k, seconds in zip(kinds, schedule, took):
            times.setdefault((kind, k), []).append(seconds)
    bench.close()
    return {"ks": ks, "ms": {f"{kind}/{k}": statistics.median(v) * 1e3 for (kind, k), v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--batch-sizes", default="1,4,8")
    parser.add_argument("--modes", default="static,dynamic", help="ORT session modes (devices.with.session_mode)")
    parser.add_argument("--rounds", type=int, default=2, help="processes per (mode, batch size)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--child", nargs=2, metavar=("MODE", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.recipe, int(args.child[1]), args.child[0], args.overrides)))
        return
    modes = args.modes.split(",")
    results: dict[tuple[str, int], list[dict]] = {}
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        for round_ in range(args.rounds):
            for mode in modes if round_ % 2 == 0 else modes[::-1]:
                command = [sys.executable, __file__, args.recipe, "--child", mode, str(batch)]
                for override in args.overrides:
                    command += ["--set", override]
                out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
                results.setdefault((mode, batch), []).append(json.loads(out.strip().splitlines()[-1]))
                print(f"batch {batch} {mode}: process {round_ + 1} done", file=sys.stderr, flush=True)
    print("| batch | session mode | call | " + " | ".join(f"K={k} ms" for k in results[next(iter(results))][0]["ks"]) + " |")
    print("|---|---|---|" + "---|" * len(results[next(iter(results))][0]["ks"]))
    for (mode, batch), runs in results.items():
        for kind in KINDS:
            cells = []
            for k in runs[0]["ks"]:
                values = [r["ms"][f"{kind}/{k}"] for r in runs if f"{kind}/{k}" in r["ms"]]
                cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})" if values else "—")
            print(f"| {batch} | {mode} | {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
