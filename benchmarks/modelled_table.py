"""A modelled no-spec / fixed K / varK table for another device, from replays of real runs.

    python benchmarks/modelled_table.py recipes/tinycode_varK.yaml recipes/tinycode_suffix.yaml \\
        --profile ai100-ultra --model llama-3.1-8b --ctx-len 2048 --batches 1,2,4,8 --k 4

For each recipe (its proposer and workload): one greedy source run with continuous batching at
one slot and K-list [0, K] records the token path; then ``spdflow.whatif.replay`` replays it at
every batch size (KV slots) as no-spec ([0]), fixed K ([K]) and varK ([0, K], smallest_covering),
each verify priced by the ``roofline`` cost model with the given device profile and model shape.
The acceptance is the source model's (the recipe's), the step costs the profile's: a model, not a
measurement. Prints a markdown table and writes JSON with ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="+")
    parser.add_argument("--profile", default="ai100-ultra")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--ctx-len", type=int, default=2048)
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override for the source runs")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from spdflow.engine.run import Engine, RunOptions
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe
    from spdflow.whatif import Scenario, load_run, make_cost_model, replay

    pm = get_plugin_manager()
    work = Path(tempfile.mkdtemp(prefix="modelled-"))
    batches = [int(b) for b in args.batches.split(",")]
    k = args.k
    rows = []
    for recipe_path in args.recipes:
        out = work / Path(recipe_path).stem
        loaded = load_recipe(recipe_path, pm, [f"num_speculative_tokens=[0, {k}]", "k_policy=smallest_covering",
                                                "specialization.batch_size=1", "specialization.full_batch_size=1",
                                                "workload.temperature=0", f"output={out}", *args.overrides])
        Engine(pm, loaded, RunOptions()).run()
        run = load_run(out, pm)
        cost = make_cost_model(pm, run, "roofline", {"profile": args.profile, "model": args.model,
                                                      "ctx_len": args.ctx_len})
        proposer = run.recipe.proposer.uses
        for batch in batches:
            base = None
            for mode, scenario in (("nospec", Scenario((0,), "nospec", batch)), (f"fixed K={k}", Scenario((k,), "fixed", batch)),
                                   (f"varK [0,{k}]", Scenario((0, k), "smallest_covering", batch))):
                p = replay(pm, run, scenario, cost)
                f = p.figures
                base = base or f
                row = {"proposer": proposer, "workload": run.recipe.workload.builtin or "file/prompts", "batch": batch,
                       "mode": mode, "decode_tok_s": f.decode_tokens_per_s, "tok_s": f.tokens_per_s,
                       "vs_nospec": f.decode_tokens_per_s / base.decode_tokens_per_s - 1,
                       "step_ms": 1e3 * f.verify_s / max(f.steps, 1), "al": f.al,
                       "k_usage": {str(kk): round(v / max(f.steps, 1), 3) for kk, v in f.k_usage.items()},
                       "exact": p.exact}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    print(json.dumps(cost.describe(), indent=1, default=str), file=sys.stderr)
    lines = ["| proposer | batch | mode | decode tok/s | Δ vs no-spec | mean verify ms | AL | K usage |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        usage = " ".join(f"K{kk}:{100 * v:.0f}%" for kk, v in r["k_usage"].items())
        lines.append(f"| {r['proposer']} | {r['batch']} | {r['mode']} | {r['decode_tok_s']:.1f} | {r['vs_nospec']:+.1%} | "
                     f"{r['step_ms']:.2f} | {r['al']:.2f} | {usage} |")
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"cost": cost.describe(), "rows": rows}, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
