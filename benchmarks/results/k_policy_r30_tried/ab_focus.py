"""A focused live A/B (issue 23, round 30): goodput and variants of it, interleaved in one bench session per cell,
without the static modes, so that more repeats fit in the same time. From the repository root:

    python benchmarks/results/k_policy_r30_tried/ab_focus.py --repeats 12 --out /tmp/ab --tag p1 \\
        --variant goodput_aa= --variant goodput_copy=@/tmp/copy/goodput.py --variant goodput_split=split_host=true \\
        --cells syn03:2,syn03:4,syn06:2,syn09:8,code:4,stdlib:1

A variant is NAME=[FIELD=VALUE;...][@FILE]: goodput with those GoodputConfig fields (JSON values), built from
goodput's own module, or with @FILE from that goodput.py loaded as a module of its own (as round 25's
``ab_variant.py`` does). Each cell runs goodput and every variant in the bench's rotating order, ``--repeats``
times, after the bench's untimed no-spec warm-up. Per cell and variant it prints the median and range over repeats
of the variant's tok/s / goodput's in the same repeat, the median of its host ms a run minus goodput's, and its
steps a run, and it fails (exit 1) if any run's tokens differ from the warm-up's no-spec tokens. One JSON per cell
goes into --out.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

CELLS = {
    "syn03": ("recipes/tinycode_varK.yaml", ["proposer={uses: synthetic, with: {acceptance_rate: 0.3}}"]),
    "syn06": ("recipes/tinycode_varK.yaml", ["proposer={uses: synthetic, with: {acceptance_rate: 0.6}}"]),
    "syn09": ("recipes/tinycode_varK.yaml", ["proposer={uses: synthetic, with: {acceptance_rate: 0.9}}"]),
    "code": ("recipes/tinycode_varK.yaml", []),
    "stdlib": ("recipes/tinycode_varK.yaml", ["workload.builtin=stdlib_tests"]),
    "thirdparty": ("recipes/tinycode_varK.yaml", ["workload.builtin=thirdparty"]),
    "rare": ("recipes/tinycode_rare.yaml", ["workload.temperature=0"]),
}


def parse_variant(text: str):
    """NAME=[FIELD=VALUE;...][@FILE] -> (name, fields, file or None)."""
    name, _, rest = text.partition("=")
    rest, _, path = rest.partition("@")
    fields = {}
    for item in filter(None, rest.split(";")):
        key, _, value = item.partition("=")
        fields[key] = json.loads(value)
    return name, fields, path or None


def variant_plugin(variants):
    from spdflow.hookspecs import hookimpl
    import spdflow_decoding.goodput as own

    makers = {}
    for name, fields, path in variants:
        module = own
        if path:
            spec = importlib.util.spec_from_file_location(f"{name}_module", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        module.GoodputConfig(**fields)  # a bad field fails here, before any bench runs
        makers[name] = (lambda m=module, f=fields: m.Goodput(m.GoodputConfig(**f)))

    class Plugin:
        @hookimpl
        def spdflow_register_k_policies(self, register):
            for name, make in makers.items():
                register(name, make, description=f"goodput variant (round 30 A/B): {name}")

    return Plugin()


def run_cell(cell: str, batch: int, modes: list[str], repeats: int, count: int) -> dict:
    from spdflow.bench import BatchBench, resolve_modes, run_order
    from spdflow.engine.run import NullUI
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe

    recipe, overrides = CELLS[cell]
    pm = get_plugin_manager()
    loaded = load_recipe(recipe, pm, [*overrides, f"workload.count={count}"])
    resolved = {m.row: m for m in resolve_modes(pm, modes, loaded.recipe)}
    bench = BatchBench(pm, loaded, batch, NullUI())
    per = {row: {} for row in resolved}
    same = True
    try:
        bench.open()
        bench.warm_up()
        reference = {i: t.tolist() for i, t in bench.baseline.items()}
        for repeat, row in run_order(list(resolved), repeats):
            run = bench.run(resolved[row], repeat)
            steps = [r for r in run.records if r.get("kind") == "step"]
            per[row][repeat] = {"tok_s": run.metrics.e2e_tokens_per_s, "steps": len(steps),
                                "host_ms": sum(float(r["host_s"]) for r in steps) * 1e3,
                                "verify_ms": sum(float(r["verify_s"]) for r in steps) * 1e3}
            same = same and run.tokens == reference
            print(f"  {cell} b{batch} repeat {repeat} {row}: {run.metrics.e2e_tokens_per_s:.0f} tok/s", file=sys.stderr,
                  flush=True)
    finally:
        bench.close()
    return {"cell": cell, "batch": batch, "repeats": repeats, "base": next(iter(resolved)), "runs": per, "identical": same}


def summary(result: dict) -> list[str]:
    runs, base = result["runs"], result["base"]
    lines = []
    for row, mine in runs.items():
        if row == base:
            continue
        ratios = [mine[r]["tok_s"] / runs[base][r]["tok_s"] for r in mine]
        host = [mine[r]["host_ms"] - runs[base][r]["host_ms"] for r in mine]
        lines.append(f"| {result['cell']} b{result['batch']} | {row} | {statistics.median(ratios):.3f} "
                     f"({min(ratios):.3f}–{max(ratios):.3f}) | {statistics.median(host):+.1f} | "
                     f"{statistics.median(m['steps'] for m in mine.values()):.0f} / "
                     f"{statistics.median(m['steps'] for m in runs[base].values()):.0f} |")
    return lines


def pool(out: Path) -> int:
    """Per cell and variant, the median over every process's repeats of tok/s ÷ goodput's in the same repeat,
    with each process's median; then each variant's geometric mean over the cells and its cells at or above 1.00."""
    cells: dict[tuple, list[dict]] = {}
    for path in sorted(out.glob("*.json")):
        result = json.loads(path.read_text())
        cells.setdefault((result["cell"], result["batch"]), []).append(result)
    print("| cell | variant | paired, pooled | per process |")
    print("|---|---|---|---|")
    by_variant: dict[str, list[float]] = {}
    for (cell, batch), results in cells.items():
        for row in results[0]["runs"]:
            if row == results[0]["base"]:
                continue
            each = [[r["runs"][row][k]["tok_s"] / r["runs"][r["base"]][k]["tok_s"] for k in r["runs"][row]]
                    for r in results]
            pooled = statistics.median([x for ratios in each for x in ratios])
            by_variant.setdefault(row, []).append(pooled)
            print(f"| {cell} b{batch} | {row} | {pooled:.3f} | {', '.join(f'{statistics.median(e):.3f}' for e in each)} |")
    print()
    for row, values in by_variant.items():
        print(f"{row}: geometric mean {statistics.geometric_mean(values):.4f} over {len(values)} cells, "
              f"{sum(v >= 1.0 for v in values)} at or above 1.00")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", required=True, help="comma-separated WORKLOAD:BATCH, workloads: " + ", ".join(CELLS))
    parser.add_argument("--variant", action="append", default=[], help="NAME=[FIELD=VALUE;...][@FILE], repeatable")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="p1")
    parser.add_argument("--pool", action="store_true", help="run nothing: pool the JSON in --out over its processes")
    args = parser.parse_args(argv)
    if args.pool:
        return pool(args.out)
    variants = [parse_variant(v) for v in args.variant]
    import spdflow.plugins as plugins

    plugin, original = variant_plugin(variants), plugins.get_plugin_manager

    def with_variants(*a, **k):
        pm = original(*a, **k)
        pm.add_plugin(plugin, "round30-variants", version="1.0")
        return pm

    plugins.get_plugin_manager = with_variants
    modes = ["goodput", *[name for name, _, _ in variants]]
    args.out.mkdir(parents=True, exist_ok=True)
    lines, identical = [], True
    for spec in args.cells.split(","):
        cell, batch = spec.split(":")
        result = run_cell(cell, int(batch), modes, args.repeats, args.count)
        (args.out / f"{cell}_b{batch}.{args.tag}.json").write_text(json.dumps(result, indent=1))
        identical = identical and result["identical"]
        lines += summary(result)
        print("\n".join(lines[-len(variants):]), flush=True)
    print("\n| cell | variant | tok/s ÷ goodput, paired (range) | host ms − goodput | steps (variant / goodput) |")
    print("|---|---|---|---|---|")
    print("\n".join(lines))
    print("every run's tokens equal the no-spec reference" if identical else "TOKENS DIFFER from the no-spec reference")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
