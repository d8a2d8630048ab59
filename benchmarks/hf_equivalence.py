"""spdflow no-spec greedy vs Hugging Face transformers greedy on a real model (default: the SmolLM2
recipe), chat prompts rendered with the model's template.

spdflow runs the recipe without a proposer (K-list [0]); HF ``generate(do_sample=False)`` runs on
the very prompt ids spdflow fed its session, with the same max_new_tokens and stop ids (EOS plus
the template's end-of-turn). Every request is identical, or its first difference is shown with
HF's top-2 logit gap there (an fp32 near-tie when below 1e-4). Writes a JSON beside the figures.

    OMP_NUM_THREADS=1 python benchmarks/hf_equivalence.py --workloads chat,edit,qa --count 8
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def run(recipe: str, workload: str, count: int, max_new_tokens: int, out_dir: Path) -> dict:
    from spdflow.engine.run import Engine, RunOptions
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe
    from spdflow.testing.equivalence import compare

    pm = get_plugin_manager()
    overrides = ["proposer=null", "num_speculative_tokens=[0]", "k_policy=smallest_covering",
                 f"workload.builtin={workload}", f"workload.count={count}", f"workload.max_new_tokens={max_new_tokens}",
                 f"output={out_dir / workload}"]
    loaded = load_recipe(recipe, pm, overrides, allow_outside_paths=True)
    engine = Engine(pm, loaded, RunOptions(cache_dir=out_dir / "cache"))
    started = time.perf_counter()
    state = engine.run()
    spdflow_s = time.perf_counter() - started
    model_dir = engine.model_dir(loaded.recipe.model, "target")
    # the stop ids the run used: EOS plus the chat template's end-of-turn ids
    from spdflow.chat import workload_requests
    from spdflow.engine.run import load_tokenizer

    info = engine.export(loaded.recipe.model, "target")[1]
    _, info, _ = workload_requests(loaded.recipe.workload, [[{"role": "user", "content": "x"}]],
                                   load_tokenizer(info), info, pm)
    eos = list(info.eos_token_ids)
    started = time.perf_counter()
    summary = compare(state.outputs, model_dir, max_new_tokens, eos)
    hf_s = time.perf_counter() - started
    return {
        "workload": workload, "requests": len(summary.comparisons), "identical": summary.identical,
        "near_ties": summary.near_ties, "unexplained": [c.request for c in summary.unexplained],
        "max_new_tokens": max_new_tokens, "stop_ids": eos,
        "prompt_tokens": [c.prompt_tokens for c in summary.comparisons],
        "generated_tokens": [len(c.spdflow_tokens) for c in summary.comparisons],
        "differences": [{"request": c.request, "position": c.first_difference, "top2_gap": c.top2_gap,
                         "spdflow": c.spdflow_token, "hf": c.hf_token} for c in summary.comparisons if not c.identical],
        "spdflow_s": round(spdflow_s, 1), "hf_s": round(hf_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="recipes/smollm2_chat_varK.yaml")
    parser.add_argument("--workloads", default="chat,edit,qa")
    parser.add_argument("--count", type=int, default=8, help="prompts per workload")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default="runs/hf-equivalence")
    parser.add_argument("--json", default="benchmarks/results/hf_equivalence_smollm2.json")
    args = parser.parse_args()
    load = os.getloadavg()
    rows = [run(args.recipe, w, args.count, args.max_new_tokens, Path(args.out)) for w in args.workloads.split(",")]
    total = sum(r["requests"] for r in rows)
    same = sum(r["identical"] for r in rows)
    ties = sum(r["near_ties"] for r in rows)
    result = {"recipe": args.recipe, "rows": rows, "requests": total, "identical": same, "near_ties": ties,
              "load_before": [round(x, 2) for x in load], "load_after": [round(x, 2) for x in os.getloadavg()]}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(f"{r['workload']:5} {r['identical']}/{r['requests']} identical, {r['near_ties']} near-ties, "
              f"unexplained {r['unexplained']}; prompts {min(r['prompt_tokens'])}-{max(r['prompt_tokens'])} tokens; "
              f"spdflow {r['spdflow_s']} s, HF {r['hf_s']} s")
    print(f"total: {same}/{total} identical, {ties} near-ties; load {result['load_before']} -> {result['load_after']}")


if __name__ == "__main__":
    main()
