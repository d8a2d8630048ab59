"""A K policy's own time per decode step, measured inside bench-style generations.

Driven alone, a policy's methods run with warm caches; inside a generation every call follows a
verify run that pushed its code and data out, and costs several times more (round 3 of issue
23: 21 µs a step alone against 63 µs inside). So this times the policy where it runs: each
call the generator makes to the policy (``propose_budget``, ``see_grades``, ``choose_k``, ``observe``) is wrapped
with ``time.perf_counter`` during interleaved runs of the given modes, as ``spdflow bench``
makes them (same warm-up, same rotating order). Per mode it prints, as medians over repeats,
µs per step of each method and their sum, the step's host time (outside verify and proposer)
and tok/s, and whether every run's tokens equal no-spec's (exit 1 if any differ). The wrapping
is in every figure (fixed K, which only returns its K, measures about 1.3 µs a call); compare
modes of one run, not figures of two runs.

With ``--pin K`` every mode verifies K on every step and runs the proposer at full length, as
``fixed:<K>`` does, while its policy's methods still run and see every step: the modes then
differ only in the policy's own work (its methods, and what it asks of the engine, such as
scoring proposals), and the columns per run (verify, host, tok/s and verify time paired with the first mode in
the same repeat) give what that work costs the run.

    python benchmarks/policy_time.py recipes/tinycode_varK.yaml --batch 1 --repeats 5 \\
        --modes fixed:2,goodput,smallest_covering --set workload.count=16 \\
        --set 'proposer={uses: synthetic, with: {acceptance_rate: 0.05}}'
    python benchmarks/policy_time.py recipes/tinycode_varK.yaml --batch 8 --repeats 8 --pin 2 \\
        --modes fixed:2,goodput --set workload.count=16
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import defaultdict

METHODS = ("propose_budget", "see_grades", "choose_k", "observe")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default="fixed,goodput,smallest_covering",
                        help="bench modes (spdflow bench --modes), comma-separated")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--pin", type=int, default=None, metavar="K",
                        help="every mode verifies this compiled K each step, its policy still consulted")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    import spdflow.engine.generate as generate
    from spdflow.bench import BatchBench, reference_tokens, resolve_modes, run_order
    from spdflow.engine.run import NullUI
    from spdflow.plugins import get_plugin_manager
    from spdflow.recipe.loader import load_recipe

    spent: dict[str, float] = defaultdict(float)
    call_policy = generate.Generator._call_policy

    def timed(self, method, *call_args):
        started = time.perf_counter()
        try:
            answer = call_policy(self, method, *call_args)
        finally:
            spent[method] += time.perf_counter() - started
        if args.pin is not None and method == "choose_k":  # what fixed:<pin> answers
            return args.pin
        if args.pin is not None and method == "propose_budget":  # every proposal at full length (k_max)
            return call_args[0]
        return answer

    pm = get_plugin_manager()
    loaded = load_recipe(args.recipe, pm, args.overrides)
    modes = {m.row: m for m in resolve_modes(pm, args.modes.split(","), loaded.recipe)}
    if args.pin is not None and args.pin not in loaded.recipe.k_list():
        print(f"--pin {args.pin}: not in the recipe's K-list {loaded.recipe.k_list()}; pin one of those.", file=sys.stderr)
        return 2
    bench = BatchBench(pm, loaded, args.batch, NullUI())
    per_mode: dict[str, list[dict]] = defaultdict(list)
    generate.Generator._call_policy = timed  # (undone in the finally below, whatever happens)
    try:
        bench.open()
        bench.warm_up()
        baseline = reference_tokens(bench)
        for repeat, row in run_order(list(modes), args.repeats):
            before = dict(spent)
            run = bench.run(modes[row], repeat)
            steps = [r for r in run.records if r.get("kind") == "step"]
            n = max(len(steps), 1)
            figures = {m: (spent[m] - before.get(m, 0.0)) / n * 1e6 for m in METHODS}
            figures["policy"] = sum(figures[m] for m in METHODS)
            figures["host"] = statistics.median(float(r["host_s"]) for r in steps) * 1e6 if steps else 0.0
            figures["tok/s"] = run.metrics.e2e_tokens_per_s
            figures["verify ms"] = sum(float(r["verify_s"]) for r in steps) * 1e3
            figures["host ms"] = sum(float(r["host_s"]) for r in steps) * 1e3
            figures["steps"] = len(steps)
            figures["same"] = run.tokens == baseline
            per_mode[row].append(figures)
            print(f"  repeat {repeat} {row}: policy {figures['policy']:.1f} µs/step, verify {figures['verify ms']:.0f} ms, "
                  f"host {figures['host ms']:.0f} ms", file=sys.stderr, flush=True)
    finally:
        generate.Generator._call_policy = call_policy  # the wrapping ends with this run
        bench.close()
    first = next(iter(per_mode))
    pinned = f", every mode verifying K = {args.pin}" if args.pin is not None else ""
    print(f"batch {args.batch}, {args.repeats} repeats{pinned}; µs per step and ms per run, medians over repeats; "
          f"paired: the median over repeats of the mode's figure ÷ {first}'s in the same repeat")
    print("| mode | " + " | ".join(METHODS) + " | policy | host (median step) | steps | verify ms | host ms "
          f"| tok/s | tok/s paired ÷ {first} | verify paired ÷ {first} | tokens = no-spec |")
    print("|---" * (len(METHODS) + 10) + "|")
    for row, runs in per_mode.items():
        cells = [f"{statistics.median(r[m] for r in runs):.1f}" for m in (*METHODS, "policy", "host")]
        cells += [f"{statistics.median(r[m] for r in runs):.0f}" for m in ("steps", "verify ms", "host ms", "tok/s")]
        paired = statistics.median(r["tok/s"] / f["tok/s"] for r, f in zip(runs, per_mode[first]))
        verify = statistics.median(r["verify ms"] / f["verify ms"] for r, f in zip(runs, per_mode[first]))
        same = "yes" if all(r["same"] for r in runs) else "**no**"
        print(f"| {row} | " + " | ".join(cells) + f" | {paired:.3f} | {verify:.3f} | {same} |")
    return 0 if all(r["same"] for runs in per_mode.values() for r in runs) else 1


@contextlib.contextmanager
def plugin_added(plugin, name: str):
    """While inside: every plugin manager made by ``spdflow.plugins.get_plugin_manager`` also has ``plugin``
    (registered under ``name``), e.g. K policies made for a probe or an A/B."""
    import spdflow.plugins as plugins

    original = plugins.get_plugin_manager

    def with_plugin(*args, **kwargs):
        pm = original(*args, **kwargs)
        pm.add_plugin(plugin, name, version="1.0")
        return pm

    plugins.get_plugin_manager = with_plugin  # looked up where a manager is made
    try:
        yield
    finally:
        plugins.get_plugin_manager = original


def main_with(plugin, name: str, argv: list[str] | None = None) -> int:
    """:func:`main` with one more plugin registered under ``name`` (:func:`plugin_added`)."""
    with plugin_added(plugin, name):
        return main(argv)


if __name__ == "__main__":
    sys.exit(main())
