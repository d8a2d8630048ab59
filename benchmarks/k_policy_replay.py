"""Issue 23: a K policy's regret over recorded runs, by exact replay (``spdflow whatif --oracle``).

The bench tables (``k_policy_tables.py``) time every policy for real, and on a shared machine the
timing noise between modes is as large as the 3 % line the issue draws. This harness judges a
policy's *decisions* instead: each recorded greedy run is replayed (the proposer runs over the
recorded outputs, so proposals and acceptance are exact) under the policy, no-spec and every
fixed K at batch sizes 1, 2, 4, 8, all priced by the run's own measured cost model, and the
policy's regret against the best static choice is reported per workload and batch size.

``goodput`` learns from the step times it observes, and in a replay those include this
machine's real host and proposer time, so its choices (and the regret) move with the load. The
harness therefore runs it as ``goodput-steady``: goodput itself, but each step's host and
proposer time are the recorded run's means (host time apart for steps with and without the proposer,
since round 29 of issue 23), times a seeded log-normal noise
(``--noise``, default 0.2; verify times get half of it) — repeatable, and each seed is a
different plausible machine. The priced figures of every replay (the policy's, no-spec's, each
fixed K's, and so the oracle's) charge each proposer call the recorded run's mean too
(``CostModel.propose_per_call_s``), beside its host time per step, so that no real time of the
replay process counts: before, the proposer's real time had moved one cell's regret from -5.5 %
to -3.0 % between two replays of it. Figures are the median over ``--seeds`` replays, with min
and max.

    python benchmarks/k_policy_replay.py --make-runs /tmp/kpr            # record the runs, time their grids (~4 min)
    python benchmarks/k_policy_replay.py --runs /tmp/kpr --seeds 4       # replay (~3 min)
    python benchmarks/k_policy_replay.py --runs /tmp/kpr --set margin=0.1 # another setting
    python benchmarks/k_policy_replay.py --make-runs /tmp/kpr2 --seed 11  # other prompts (held out)

The cost model's cautions (what ``spdflow whatif`` notes, e.g. a K the recorded run held only in short spells, priced
at its slow steps after a change) are printed per cell as the replays run: at batch 1 on round 26's recordings,
K = 0 for code and stdlib_tests (issue 23, round 28).

Only whatif's priced figures are used; no figure here is a measured speed. ``--make-runs`` times
every run's grids at ``--batch-sizes`` itself, one run at a time, so replays only read them and
several can run at once; keep the machine otherwise quiet while it does.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from k_policy_tables import LINE, WORKLOADS  # noqa: E402

#: the embedded-model workloads the tables have (the real-model one is too slow to replay here)
DEFAULT_WORKLOADS = "code,rare,synthetic_0.3,synthetic_0.6,synthetic_0.9,stdlib_tests,thirdparty"


def make_runs(out: Path, workloads: list[str], count: int, seed: int, batch_sizes: list[int]) -> None:
    """One greedy ``spdflow run`` per workload at batch 1 (the replay changes the batch size),
    then each run's grids at ``batch_sizes`` (:func:`time_grids`)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in workloads:
        workload = WORKLOADS[name]
        command = [sys.executable, "-m", "spdflow", "run", workload.recipe, "-q", "--allow-outside-paths",
                   "--set", f"name=kpr-{name}", "--set", f"output={out / name}",
                   "--set", f"workload.count={count}", "--set", f"workload.seed={seed}",
                   "--set", "workload.temperature=0", "--set", "specialization.batch_size=1"]
        for override in workload.overrides:
            command += ["--set", override]
        print(f"== {name}: {' '.join(command[3:])}", file=sys.stderr, flush=True)
        subprocess.run(command, cwd=REPO, check=True)
    time_grids(out, workloads, batch_sizes)


def time_grids(out: Path, workloads: list[str], batch_sizes: list[int]) -> None:
    """Time each recorded run's step-cost grid at every batch size now, one run at a time.

    The replays price every step from these grids and goodput starts from them. Left to the
    replays, a grid is timed on first use, under whatever else runs then: two replays started
    together once timed each other's load into batch 2's grid (K = 0 8.6 ms, K = 2 4.4 ms), and
    goodput sat at K = 4 in that priced world, a -35 % cell that was the grid's, not the rule's.
    """
    from spdflow import whatif as wi
    from spdflow.plugins import get_plugin_manager

    pm = get_plugin_manager()
    for name in workloads:
        run = wi.load_run(out / name, pm)
        cost = wi.make_cost_model(pm, run, "measured")
        ks = sorted(set(run.recipe.k_list()) | {0})
        cost.prepare({batch: ks for batch in batch_sizes})
        loads = {batch: entry.load[0] for batch, entry in sorted(cost.grid.items()) if entry.load}
        print(f"== {name}: grids timed at batch sizes {batch_sizes} (1-minute load {loads})", file=sys.stderr, flush=True)


def steady_plugin(settings: dict):
    """A plugin registering ``goodput-steady``: goodput fed the recorded run's mean host and
    proposer time per step (times seeded noise) instead of this machine's replay timings."""
    from spdflow.hookspecs import hookimpl
    from spdflow_decoding import Goodput, GoodputConfig

    class Steady(Goodput):
        name = "goodput-steady"
        host_s = 0.0  # the recorded steps' mean host time
        idle_host_s = 0.0  # ... of the steps that did not run the proposer, and of those that did
        busy_host_s = 0.0
        propose_s = 0.0
        noise = 0.0
        rng = random.Random(0)

        def observe(self, outcome):
            cls, draw = type(self), type(self).rng.lognormvariate
            host = cls.busy_host_s if outcome.propose_s > 0 else cls.idle_host_s
            propose, verify = cls.propose_s, outcome.verify_s
            if cls.noise:
                host *= draw(0, cls.noise)
                propose *= draw(0, cls.noise)
                verify *= draw(0, cls.noise / 2)
            super().observe(dataclasses.replace(outcome, verify_s=verify, host_s=host,
                                                propose_s=propose if outcome.propose_s > 0 else 0.0))

    class Plugin:
        @hookimpl
        def spdflow_register_k_policies(self, register):
            register(Steady.name, lambda: Steady(GoodputConfig(**settings)),
                     description="goodput on the recorded run's mean host and proposer time (replay harness)")

    return Plugin(), Steady


def recorded_steps(run_dir: Path) -> list[dict]:
    """The decode steps of a recorded run's trace."""
    return [json.loads(line) for line in (run_dir / "trace.jsonl").read_text().splitlines() if '"kind": "step"' in line]


def run_means(run_dir: Path, steps: list[dict] | None = None) -> tuple[float, float]:
    """Mean host seconds per step and proposer seconds per call of the recorded run."""
    steps = recorded_steps(run_dir) if steps is None else steps
    calls = [s["propose_s"] for s in steps if s["propose_s"] > 0]
    return statistics.fmean(s["host_s"] for s in steps), statistics.fmean(calls) if calls else 0.0


def host_means(run_dir: Path, steps: list[dict] | None = None) -> tuple[float, float]:
    """Mean host seconds of the recorded run's steps that did not run the proposer and of those that
    did, as the bench's oracle splits them (:func:`spdflow.oracle.host_apart`: either is the mean of
    every step where the run has fewer than 5 of its kind). Fed one mean for both, goodput learned
    skipping's host time from drafting steps (issue 23, round 29)."""
    from spdflow.oracle import host_apart

    idle, busy, _ = host_apart(recorded_steps(run_dir) if steps is None else steps)
    return idle, busy


def load_for_replay(pm, run_dir: Path, steady, noise: float):
    """The recorded run and its measured cost model, with ``steady`` (a :func:`steady_plugin`
    class) fed the run's mean host and proposer time under ``noise``, and the proposer priced at
    that mean per call."""
    from spdflow import whatif as wi

    run = wi.load_run(run_dir, pm)
    cost = wi.make_cost_model(pm, run, "measured")
    steps = recorded_steps(run_dir)  # read once for both
    steady.host_s, steady.propose_s = run_means(run_dir, steps)
    steady.idle_host_s, steady.busy_host_s = host_means(run_dir, steps)
    cost.propose_per_call_s = steady.propose_s
    steady.noise = noise
    return run, cost


def replay_all(runs: Path, policy: str, settings: dict, batch_sizes: list[int], seeds: int, noise: float) -> dict:
    from spdflow.oracle import oracle_report
    from spdflow.plugins import get_plugin_manager

    pm = get_plugin_manager()
    plugin, steady = steady_plugin(settings)
    pm.add_plugin(plugin, "k-policy-replay", version="1.0")
    name = steady.name if policy == "goodput" else policy
    results: dict = {}
    for run_dir in sorted(p for p in runs.iterdir() if (p / "trace.jsonl").exists()):
        run, cost = load_for_replay(pm, run_dir, steady, noise)
        cells = results[run_dir.name] = {}
        for batch in batch_sizes:
            for caution in cost.cautions(batch):  # e.g. a K the recorded run held only in short spells
                print(f"{run_dir.name} b{batch}: caution: {caution}", file=sys.stderr, flush=True)
            regrets, efficiencies = [], []
            for seed in range(1, seeds + 1):
                steady.rng = random.Random(f"{run_dir.name}:{batch}:{seed}")
                report = oracle_report(pm, run, cost, name, batch)
                regrets.append(report.regret), efficiencies.append(report.efficiency)
            cells[batch] = {"regret": regrets, "efficiency": efficiencies}
            print(f"{run_dir.name} b{batch}: regret median {statistics.median(regrets) * 100:+.1f} %", file=sys.stderr,
                  flush=True)
    return results


def render(results: dict, batch_sizes: list[int]) -> str:
    head = "| workload | " + " | ".join(f"batch {b}" for b in batch_sizes) + " |"
    lines = [head, "|---" * (len(batch_sizes) + 1) + "|"]
    medians = []
    for name, cells in results.items():
        row = []
        for b in batch_sizes:
            r = cells[b]["regret"]
            m = statistics.median(r)
            medians.append(m)
            mark = " **below**" if 1 + m < LINE else ""
            row.append(f"{m * 100:+.1f} % ({min(r) * 100:+.1f}..{max(r) * 100:+.1f}){mark}")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    below = sum(1 + m < LINE for m in medians)
    lines.append("")
    lines.append(f"Regret against max(no-spec, best fixed K), priced; median over seeds (min..max). Cells below the "
                 f"{LINE} line: {below} of {len(medians)}; worst median {min(medians) * 100:+.1f} %, "
                 f"mean {statistics.fmean(medians) * 100:+.2f} %.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--make-runs", type=Path, help="record one run per workload into this directory, then stop")
    parser.add_argument("--runs", type=Path, help="replay the runs in this directory")
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS, help=f"with --make-runs (default {DEFAULT_WORKLOADS})")
    parser.add_argument("--count", type=int, default=16, help="prompts per run (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed of the recorded runs (default 0)")
    parser.add_argument("--policy", default="goodput", help="the K policy to replay (goodput runs as goodput-steady)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a goodput setting (with: field), repeatable")
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--seeds", type=int, default=4, help="noise seeds per cell (default 4)")
    parser.add_argument("--noise", type=float, default=0.2, help="log-normal sigma of the fed timings (default 0.2)")
    parser.add_argument("--json", type=Path, help="also write the per-seed figures here")
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.make_runs:
        make_runs(args.make_runs, args.workloads.split(","), args.count, args.seed, sizes)
        return
    if not args.runs:
        parser.error("give --make-runs DIR or --runs DIR")
    import yaml

    settings = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.settings)}
    results = replay_all(args.runs, args.policy, settings, sizes, args.seeds, args.noise)
    if args.json:
        args.json.write_text(json.dumps({"policy": args.policy, "settings": settings, "noise": args.noise,
                                         "results": results}, indent=1))
    print(render(results, sizes))


if __name__ == "__main__":
    main()
