"""K policies at batch 1 on a simulated machine that drifts as the recorded one did.

Why a simulator: on the shared 2-core machine the benches run on, one bench's repeats differ by
up to ±30 % and two processes of the same bench by more than one's interval, so live A/Bs of two
versions of the rule could not tell 3 % apart (benchmarks/k_policy_rounds.md, issue 23, rounds 5-9). Here
every policy meets the same drift and the same accepted tokens (common random numbers), so a
difference between two policies on a run is theirs alone, and a sweep of 270 generations takes
seconds. What it keeps of the machine is what a policy's choices run into: the speed drifting
under every shape alike, and the extra time of changing shape. What it leaves out (the policy's
own time, prefill, batch > 1, real proposers) is measured by ``spdflow bench`` instead.

Model, per generation (``--requests`` requests of ``--tokens`` tokens, batch 1, K-list 0,2,4,7):

* Acceptance: the ``synthetic`` proposer's: each proposal position holds with chance A once the
  one before held. Draws are per (request, token index, position), the same for every policy.
* A step at K: verify ``VERIFY_MS[K] x speed(t)``, host ``HOST_MS[K] x speed(t)``, 0.015 ms of
  proposer when the proposer ran. ``--ratio`` sets K=4's verify over K=2's (K=7 is 1.15x K=4);
  fixed runs at batch 1 measured 1.06-1.18 (round 9).
* speed(t): a recorded trace (``results/k_policy_sim/speed_traces.json``: each step's verify time
  over its run's median, from fixed-K runs), read at the simulated time, from a random start.
* Changing K: the first step at the new K costs ``--first`` ms more and the next 11 ``--tail`` ms
  in all (geometric, 0.8 a step): round 9 measured 0.28-0.39 and 0.63-1.49 ms in all.
* The policy's timed grid: each K's true verify time at the start's speed, its distance from
  K = 0 scaled by ``--grid-bias`` and then off by a Gaussian of ``--grid-noise`` (relative).

Each policy's tokens/s is divided by the best static choice's (no-spec or a fixed K, the one with
the best median over the runs) on the same run.

    python benchmarks/k_policy_sim.py                                 # goodput as shipped and at follow 0.8
    python benchmarks/k_policy_sim.py --variant default --variant follow=1 --grid-noise 0.15
    python benchmarks/k_policy_sim.py --variant default --variant margin=0.06 --acceptance 0.6
    python benchmarks/k_policy_sim.py --no-drift                      # the same machine at constant speed
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import yaml

from spdflow.api import NoServices, StepContext, StepOutcome

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from k_policy_tables import LINE  # noqa: E402

TRACES = REPO / "benchmarks" / "results" / "k_policy_sim" / "speed_traces.json"
KS = (0, 2, 4, 7)
VERIFY_K2_MS, VERIFY_K0_MS, K7_OVER_K4 = 1.35, 1.15, 1.15
HOST_MS = {0: 0.17, 2: 0.19, 4: 0.20, 7: 0.21}
PROPOSE_MS = 0.015


def verify_ms(ratio: float) -> dict[int, float]:
    """Each K's verify time at speed 1 (batch 1, the embedded model's scale), K=4 at ``ratio`` x K=2."""
    k4 = VERIFY_K2_MS * ratio
    return {0: VERIFY_K0_MS, 2: VERIFY_K2_MS, 4: k4, 7: k4 * K7_OVER_K4}


@dataclass
class Trace:
    """Machine speed over time: ``factor[i]`` holds from ``start[i]`` (seconds) to the next start."""

    start: list[float]
    factor: list[float]

    @property
    def length_s(self) -> float:
        return self.start[-1]

    @classmethod
    def from_record(cls, record: dict) -> "Trace":
        start, t = [], 0.0
        for factor in record["factor"]:
            start.append(t)
            t += factor * record["median_step_ms"] / 1e3
        start.append(t)
        return cls(start, list(record["factor"]) + [record["factor"][-1]])


def load_traces(path: Path = TRACES) -> list[Trace]:
    return [Trace.from_record(record) for record in json.loads(path.read_text())["traces"]]


class Machine:
    """Step times on a drifting machine, with the extra time of changing shape."""

    def __init__(self, trace: Trace, verify: dict[int, float], first_ms: float, tail_ms: float, offset_s: float):
        self.trace, self.verify = trace, verify
        self.first_s, self.tail_s = first_ms / 1e3, tail_ms / 1e3
        self.t = offset_s
        self._i = 0
        self._last_k: int | None = None
        self._since = 99  # steps since the last change of K
        self._tail_sum = sum(0.8 ** j for j in range(1, 12))

    def speed(self) -> float:
        start, t = self.trace.start, self.t % self.trace.length_s
        if start[self._i] > t:
            self._i = 0
        while start[self._i + 1] <= t:
            self._i += 1
        return self.trace.factor[self._i]

    def step(self, k: int, propose_s: float) -> tuple[float, float]:
        """Run a step at K: (verify seconds, host seconds); the clock moves on."""
        speed = self.speed()
        if self._last_k is not None and k != self._last_k:
            self._since = 0
        extra = self.first_s if self._since == 0 else (
            self.tail_s * 0.8 ** self._since / self._tail_sum if self._since < 12 else 0.0)
        self._since += 1
        self._last_k = k
        verify = self.verify[k] / 1e3 * speed + extra
        host = HOST_MS[k] / 1e3 * speed
        self.t += verify + host + propose_s
        return verify, host


class Fixed:
    """A static choice: K on every step (0: no-spec), the proposer asked for K tokens."""

    def __init__(self, k: int):
        self.k = k

    def start(self, compiled_ks, rows, services=None):
        pass

    def propose_budget(self, k_max, step):
        return min(self.k, k_max)

    def choose_k(self, proposal_counts, compiled_ks):
        return self.k

    def observe(self, outcome):
        pass


def generate(policy, acceptance: float, machine: Machine, seed: int, grid_noise: float, grid_bias: float,
             requests: int = 16, tokens: int = 128) -> float:
    """One generation at batch 1; its decode tokens per second."""
    draws = random.Random(seed)
    grid_draws = random.Random(seed + 1_000_003)
    speed, base = machine.speed(), machine.verify[KS[0]]
    grid = {k: (base + grid_bias * (machine.verify[k] - base)) / 1e3 * speed * (1 + grid_draws.gauss(0, grid_noise))
            for k in KS}
    policy.start(list(KS), 1, NoServices(grid))
    max_k, emitted, started = KS[-1], 0, machine.t
    for request in range(requests):
        held = [[draws.random() < acceptance for _ in range(max_k)] for _ in range(tokens)]
        done = 1  # prefill gave the first token
        while done < tokens:
            left = tokens - done
            budget = policy.propose_budget(max_k, StepContext((left,), 0, 1, (request,)))
            n = min(budget, max_k, left - 1)
            k = policy.choose_k([n], list(KS))
            matched = 0
            while matched < n and held[done][matched]:
                matched += 1
            accepted = min(matched, k)
            propose_s = PROPOSE_MS / 1e3 if n else 0.0
            verify_s, host_s = machine.step(k, propose_s)
            scored = ((min(matched + 1, n), matched),) if n else ()
            policy.observe(StepOutcome(k, (min(n, k),), (accepted,), verify_s, propose_s, host_s, scored,
                                       (request,) * len(scored)))
            step_tokens = min(accepted + 1, left)
            done += step_tokens
            emitted += step_tokens
    return emitted / (machine.t - started)


def parse_variant(text: str) -> dict:
    """``follow=0,margin=0.05`` -> {"follow": 0, "margin": 0.05} (values read as YAML); ``default`` -> {}."""
    if text == "default":
        return {}
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise SystemExit(f"--variant '{text}': expected key=value[,key=value] or 'default'")
        out[key.strip()] = yaml.safe_load(value)
    return out


def goodput_factory(settings: dict) -> Callable[[], object]:
    from spdflow_decoding import Goodput, GoodputConfig

    config = GoodputConfig(**settings)
    return lambda: Goodput(config)


def sweep(variants: dict[str, Callable[[], object]], acceptances: Sequence[float], ratios: Sequence[float],
          runs: int, traces: list[Trace], first_ms: float, tail_ms: float, grid_noise: float,
          grid_bias: float, requests: int, tokens: int) -> list[dict]:
    """Per (acceptance, ratio): each static choice's median tokens/s and each variant's ratios
    to the best static choice, run by run."""
    rows = []
    for acceptance in acceptances:
        for ratio in ratios:
            verify = verify_ms(ratio)
            makers = {("no-spec" if k == 0 else f"fixed K={k}"): (lambda k=k: Fixed(k)) for k in KS}
            makers.update(variants)
            rates: dict[str, list[float]] = {name: [] for name in makers}
            for run in range(runs):
                trace = traces[run % len(traces)]
                offset = random.Random(run).random() * trace.length_s
                for name, make in makers.items():
                    machine = Machine(trace, verify, first_ms, tail_ms, offset)
                    rates[name].append(generate(make(), acceptance, machine, run, grid_noise, grid_bias,
                                                requests, tokens))
            static = [name for name in makers if name not in variants]
            best = max(static, key=lambda name: statistics.median(rates[name]))
            rows.append({"acceptance": acceptance, "ratio": ratio, "best": best,
                         "static": {name: statistics.median(rates[name]) for name in static},
                         "ratios": {name: [p / b for p, b in zip(rates[name], rates[best])] for name in variants}})
    return rows


def table(rows: list[dict], variants: Sequence[str]) -> str:
    head = ["acceptance", "K4/K2 verify", "best static (tok/s)"]
    head += [f"{name}: median (min-max)" for name in variants] + [f"{name}: runs >= {LINE}" for name in variants]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [f"{row['acceptance']:g}", f"{row['ratio']:g}", f"{row['best']} ({row['static'][row['best']]:.0f})"]
        for name in variants:
            r = row["ratios"][name]
            cells.append(f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})")
        for name in variants:
            r = row["ratios"][name]
            cells.append(f"{sum(x >= LINE for x in r)}/{len(r)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", default=None,
                        help="goodput's with: settings of one variant, e.g. follow=0 or 'default' (repeatable; "
                             "default: default and follow=0.8)")
    parser.add_argument("--acceptance", default="0.3,0.6,0.9", help="comma-separated synthetic acceptance rates")
    parser.add_argument("--ratio", default="1.05,1.1,1.18", help="comma-separated K=4 / K=2 verify time ratios")
    parser.add_argument("--runs", type=int, default=30, help="generations per policy and setting (default 30)")
    parser.add_argument("--grid-noise", type=float, default=0.1, help="relative error of the timed grid (default 0.1)")
    parser.add_argument("--grid-bias", type=float, default=1.0,
                        help="the grid's K - K=0 distance over the true one (default 1: unbiased)")
    parser.add_argument("--first", type=float, default=0.33, help="extra ms of the first step after a change of K")
    parser.add_argument("--tail", type=float, default=0.7, help="extra ms of the next 11 steps, in all")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--no-drift", action="store_true", help="a machine at constant speed instead of the traces")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    names = args.variant or ["default", "follow=0.8"]
    from pydantic import ValidationError

    try:
        variants = {name: goodput_factory(parse_variant(name)) for name in names}
    except ValidationError as exc:
        first = exc.errors()[0]
        parser.error(f"--variant: goodput setting '{'.'.join(map(str, first['loc']))}': {first['msg']}")
    traces = [Trace([0.0, 3600.0], [1.0, 1.0])] if args.no_drift else load_traces(args.traces)
    rows = sweep(variants, [float(a) for a in args.acceptance.split(",")], [float(r) for r in args.ratio.split(",")],
                 args.runs, traces, args.first, args.tail, args.grid_noise, args.grid_bias, args.requests, args.tokens)
    print(f"goodput ÷ the best static choice, same run (trace, start, draws), {args.runs} runs per row; "
          f"{'no drift' if args.no_drift else 'recorded drift'}, grid noise {args.grid_noise:g}, "
          f"grid bias {args.grid_bias:g}, switch {args.first:g} + {args.tail:g} ms\n")
    print(table(rows, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
