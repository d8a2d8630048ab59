"""A live A/B of goodput variants with its own A/A: goodput and variants of it, interleaved in one bench session per cell.

`spdflow bench` and `k_policy_tables.py` run every static mode beside the policies, so a repeat of a cell takes six
or more runs. To judge a change to goodput only goodput and the variant need to run: this runs goodput and each
``--variant`` in the bench's rotating order, ``--repeats`` times after the bench's untimed no-spec warm-up, in one
bench session per cell (WORKLOAD:BATCH, the workloads of ``k_policy_tables.py``). Register goodput a second time
with no fields (``--variant goodput_aa=``) and the same runs measure an A/A: what the design shows when nothing
differs. In issue 23's round 30, 12 repeats in each of two processes gave the A/A's pooled paired ratios of 0.975–1.038
a cell and geometric means over 6 to 11 cells of 0.997–1.008 (six A/Bs).

A variant is ``NAME=[FIELD=VALUE;...][@FILE]``: goodput with those ``GoodputConfig`` fields (JSON values), built from
goodput's own module, or with ``@FILE`` from that goodput.py loaded as a module of its own (round 30 found no cost in
that). ``--set KEY=VALUE`` (repeatable) adds a recipe override to every cell, as ``spdflow bench --set`` does, e.g.
``devices.with.threads=1`` to A/B under other session settings. Per cell and variant it prints the median and range
over repeats of the variant's tok/s ÷ goodput's in the same repeat, its host ms a run minus goodput's, and the steps a
run, writes one JSON per cell into ``--out`` (``<workload>_b<batch>.<tag>.json``; each run with its steps per K,
``k_steps``), and exits 1 if any run's tokens
differ from the warm-up's no-spec tokens.
``--pool`` runs nothing: it pools every JSON in ``--out`` (several processes, by their tags) per cell and prints
each variant's geometric mean over the cells. From the repository root:

    python benchmarks/policy_ab.py --cells synthetic_0.3:4,code:4 --repeats 12 --out /tmp/ab --tag p1 \\
        --variant goodput_aa= --variant 'goodput_sm=skip_margin=0.03'
    python benchmarks/policy_ab.py --out /tmp/ab --pool

Exit codes: 0 done, 1 a run's tokens differed from no-spec's, 2 bad arguments (an unknown workload or field).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from k_policy_tables import WORKLOADS  # noqa: E402
from policy_time import plugin_added  # noqa: E402


def parse_variant(text: str) -> tuple[str, dict, str | None]:
    """``NAME=[FIELD=VALUE;...][@FILE]`` -> (name, fields, file or None); ValueError when it is not that."""
    name, equals, rest = text.partition("=")
    if not name or not equals:
        raise ValueError(f"--variant {text!r}: write NAME=[FIELD=VALUE;...][@FILE], e.g. goodput_aa= or goodput_x=margin=0.1")
    rest, _, path = rest.partition("@")
    fields = {}
    for item in filter(None, rest.split(";")):
        key, equals, value = item.partition("=")
        if not key or not equals:
            raise ValueError(f"--variant {text!r}: {item!r} is not FIELD=VALUE")
        try:
            fields[key] = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"--variant {text!r}: {key}'s value {value!r} is not JSON (strings need quotes)") from None
    return name, fields, path or None


def variant_plugin(variants: list[tuple[str, dict, str | None]]):
    """A plugin registering each variant as a K policy; a field goodput does not have fails here, before any bench."""
    from spdflow.hookspecs import hookimpl
    import spdflow_decoding.goodput as own

    makers = {}
    for name, fields, path in variants:
        module = own
        if path:
            spec = importlib.util.spec_from_file_location(f"policy_ab_{name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        module.GoodputConfig(**fields)
        makers[name] = (lambda m=module, f=fields: m.Goodput(m.GoodputConfig(**f)))

    class Plugin:
        @hookimpl
        def spdflow_register_k_policies(self, register):
            for name, make in makers.items():
                register(name, make, description=f"goodput variant {name} (benchmarks/policy_ab.py)")

    return Plugin()


def cell_recipe(pm, workload: str, extra: list[str]):
    """The workload's recipe loaded with its own overrides, then ``extra`` (KEY=VALUE each)."""
    from spdflow.recipe.loader import load_recipe

    chosen = WORKLOADS[workload]
    return load_recipe(str(REPO / chosen.recipe), pm, [*chosen.overrides, *extra])


def run_cell(workload: str, batch: int, modes: list[str], repeats: int, count: int,
             overrides: tuple[str, ...] = ()) -> dict:
    """One bench session: the warm-up, then every mode ``repeats`` times in the bench's rotating order;
    ``overrides`` (KEY=VALUE, as ``spdflow bench --set``) go after the workload's own."""
    from spdflow.bench import BatchBench, resolve_modes, run_order
    from spdflow.engine.run import NullUI
    from spdflow.plugins import get_plugin_manager

    pm = get_plugin_manager()
    loaded = cell_recipe(pm, workload, [f"workload.count={count}", *overrides])
    resolved = {m.row: m for m in resolve_modes(pm, modes, loaded.recipe)}
    bench = BatchBench(pm, loaded, batch, NullUI())
    runs: dict[str, dict[int, dict]] = {row: {} for row in resolved}
    identical = True
    try:
        bench.open()
        bench.warm_up()
        reference = {i: tokens.tolist() for i, tokens in bench.baseline.items()}
        for repeat, row in run_order(list(resolved), repeats):
            run = bench.run(resolved[row], repeat)
            steps = [r for r in run.records if r.get("kind") == "step"]
            runs[row][repeat] = {"tok_s": run.metrics.e2e_tokens_per_s, "steps": len(steps),
                                 "host_ms": sum(float(r["host_s"]) for r in steps) * 1e3,
                                 "verify_ms": sum(float(r["verify_s"]) for r in steps) * 1e3,
                                 "k_steps": dict(sorted(Counter(int(r["k"]) for r in steps).items()))}
            identical = identical and run.tokens == reference
            print(f"  {workload} b{batch} repeat {repeat} {row}: {run.metrics.e2e_tokens_per_s:.0f} tok/s",
                  file=sys.stderr, flush=True)
    finally:
        bench.close()
    return {"cell": workload, "batch": batch, "repeats": repeats, "base": next(iter(resolved)), "runs": runs,
            "identical": identical, "overrides": list(overrides)}


def paired(result: dict, row: str) -> list[float]:
    """Per repeat: ``row``'s tok/s ÷ the base mode's (goodput) in the same repeat."""
    runs, base = result["runs"], result["base"]
    return [runs[row][r]["tok_s"] / runs[base][r]["tok_s"] for r in runs[row]]


def pooled_paired(results: list[dict], row: str) -> float:
    """The median over every process's repeats (``results``: one cell's processes) of :func:`paired`."""
    return statistics.median([x for result in results for x in paired(result, row)])


def summary(result: dict) -> list[str]:
    """One table row per variant of one cell's result."""
    runs, base, lines = result["runs"], result["base"], []
    for row, mine in runs.items():
        if row == base:
            continue
        ratios = paired(result, row)
        host = [mine[r]["host_ms"] - runs[base][r]["host_ms"] for r in mine]
        lines.append(f"| {result['cell']} b{result['batch']} | {row} | {statistics.median(ratios):.3f} "
                     f"({min(ratios):.3f}–{max(ratios):.3f}) | {statistics.median(host):+.1f} | "
                     f"{statistics.median(m['steps'] for m in mine.values()):.0f} / "
                     f"{statistics.median(m['steps'] for m in runs[base].values()):.0f} |")
    return lines


def load_results(*folders: Path) -> dict[tuple[str, int], list[dict]]:
    """(workload, batch) -> the result of every process in ``folders`` (their ``*.json``)."""
    cells: dict[tuple[str, int], list[dict]] = {}
    for folder in folders:
        for path in sorted(Path(folder).glob("*.json")):
            result = json.loads(path.read_text())
            cells.setdefault((result["cell"], result["batch"]), []).append(result)
    return cells


def pool(out: Path) -> int:
    """Per cell and variant, the median over every process's repeats of tok/s ÷ goodput's in the same repeat, with
    each process's median; then each variant's geometric mean over the cells and its cells at or above 1.00."""
    cells = load_results(out)
    if not cells:
        print(f"--pool: no results (*.json) in {out}; run some cells with --out {out} first", file=sys.stderr)
        return 2
    print("| cell | variant | paired, pooled | per process |")
    print("|---|---|---|---|")
    by_variant: dict[str, list[float]] = {}
    for (cell, batch), results in cells.items():
        for row in results[0]["runs"]:
            if row == results[0]["base"]:
                continue
            each = [paired(result, row) for result in results]
            pooled = pooled_paired(results, row)
            by_variant.setdefault(row, []).append(pooled)
            print(f"| {cell} b{batch} | {row} | {pooled:.3f} | {', '.join(f'{statistics.median(e):.3f}' for e in each)} |")
    print()
    for row, values in by_variant.items():
        print(f"{row}: geometric mean {statistics.geometric_mean(values):.4f} over {len(values)} cells, "
              f"{sum(v >= 1.0 for v in values)} at or above 1.00")
    return 0


def parse_cells(text: str) -> list[tuple[str, int]]:
    """``WORKLOAD:BATCH,...`` -> [(workload, batch)]; ValueError naming the first bad one."""
    cells = []
    for item in filter(None, text.split(",")):
        workload, colon, batch = item.partition(":")
        if workload not in WORKLOADS:
            raise ValueError(f"--cells: unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
        if WORKLOADS[workload].extra_args:
            raise ValueError(f"--cells: {workload} needs bench arguments this script does not pass "
                             f"({' '.join(WORKLOADS[workload].extra_args)}); run it with spdflow bench")
        if not colon or not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"--cells: {item!r} needs a batch size, e.g. {workload}:4")
        cells.append((workload, int(batch)))
    if not cells:
        raise ValueError("--cells: name at least one WORKLOAD:BATCH")
    return cells


def check_overrides(cells: list[tuple[str, int]], overrides: list[str]) -> None:
    """Load each cell's recipe with ``overrides`` once, so a bad ``--set`` fails before any bench runs."""
    if not overrides:
        return
    from spdflow.plugins import get_plugin_manager

    pm = get_plugin_manager()
    for workload in dict.fromkeys(workload for workload, _ in cells):
        cell_recipe(pm, workload, overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", help=f"comma-separated WORKLOAD:BATCH; workloads: {', '.join(WORKLOADS)}")
    parser.add_argument("--variant", action="append", default=[], help="NAME=[FIELD=VALUE;...][@FILE], repeatable")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--count", type=int, default=16, help="prompts per run (default 16)")
    parser.add_argument("--out", type=Path, required=True, help="folder of the per-cell JSON")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override for every cell, as spdflow bench --set (e.g. devices.with.threads=1)")
    parser.add_argument("--tag", default="p1", help="this process's name in the JSON file names (default p1)")
    parser.add_argument("--pool", action="store_true", help="run nothing: pool the JSON in --out over its processes")
    args = parser.parse_args(argv)
    if args.pool:
        return pool(args.out)
    try:
        cells = parse_cells(args.cells or "")
        variants = [parse_variant(v) for v in args.variant]
        if not variants:
            raise ValueError("--variant: name at least one (e.g. --variant goodput_aa= for an A/A)")
        if args.repeats < 1:
            raise ValueError("--repeats must be at least 1")
        plugin = variant_plugin(variants)
        check_overrides(cells, args.overrides)
    except Exception as exc:  # a bad field is pydantic's ValidationError; a bad --set a RecipeError
        print(f"policy_ab: {exc}", file=sys.stderr)
        for finding in getattr(exc, "findings", ()):
            print(finding.render(), file=sys.stderr)
        return 2
    modes = ["goodput", *[name for name, _, _ in variants]]
    args.out.mkdir(parents=True, exist_ok=True)
    lines, identical = [], True
    with plugin_added(plugin, "policy-ab-variants"):
        for workload, batch in cells:
            result = run_cell(workload, batch, modes, args.repeats, args.count, tuple(args.overrides))
            (args.out / f"{workload}_b{batch}.{args.tag}.json").write_text(json.dumps(result, indent=1))
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
