"""The oracle K schedule of a greedy run, and how far a K policy is from it.

Greedy SpD is lossless, so the run's outputs fix the token path whatever K is verified. At
every point of that path the proposer's proposal is fixed too (it depends only on the tokens so
far), so how many tokens a verify at K would accept there is known: ``min(K, m)``, with ``m``
the length of the proposal's prefix that equals the recorded continuation. Knowing ``m`` at
every point, the fastest schedule — the K of every step — is a shortest path: from point ``e``
(tokens emitted) a step at K costs the cost model's verify time (plus a switch when K changes)
and moves to ``e + min(K, m(e)) + 1``. :func:`oracle` solves it exactly (dynamic programming over
points and the previous K) with the same cost model a what-if replay uses, so

* ``policy efficiency`` = the policy's predicted tokens/s ÷ the oracle's, and
* ``regret`` = the policy's tokens/s ÷ max(no-spec, the best fixed K of the list) − 1

compare like with like. One row at a time: the oracle is computed for batch size 1 (a static
batch shares one K per step across rows, whose joint best schedule is another problem).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from spdflow.api import CostModel, ProposeInput, Request
from spdflow.errors import UsageError


@dataclass
class OracleSchedule:
    """The best schedule's decode cost and shape use (batch 1)."""

    verify_s: float
    steps: int
    k_usage: dict[int, int]
    #: per request: the K of each step of the best schedule
    schedules: dict[int, list[int]] = field(default_factory=dict)


def match_lengths(pm, run, proposer, k_max: int) -> tuple[dict[int, np.ndarray], float, int]:
    """``m(e)`` for every request and every point ``e`` (tokens emitted, 1 ≤ e < n) of its
    recorded output: how many leading tokens of the proposal made there (up to ``k_max``) equal
    what followed. Requests are fed in order, one token at a time, as a no-spec run would.
    Also returns the proposer's total seconds and number of calls (its time per step)."""
    out: dict[int, np.ndarray] = {}
    seconds, calls = 0.0, 0
    for request in run.requests:
        output = np.asarray(run.outputs[request.index], dtype=np.int64)
        prompt = np.asarray(request.prompt_ids, dtype=np.int64)
        n = len(output)
        m = np.zeros(max(n, 1), dtype=np.int64)
        proposer.add_request(0, request)
        if n:
            proposer.on_accepted(0, output[:1].copy())
        context = np.concatenate([prompt, output])
        for e in range(1, n):
            budget = min(k_max, n - e - 1)
            if budget <= 0:
                break
            tokens = context[: len(prompt) + e].copy()
            tokens.setflags(write=False)
            start = time.perf_counter()
            proposal = pm.hook.spdflow_propose(proposer=proposer, inputs=[ProposeInput(
                0, request.index, tokens, len(prompt), budget)])[0]
            seconds += time.perf_counter() - start
            calls += 1
            drafted = np.asarray(proposal.tokens, dtype=np.int64)[:budget]
            truth = output[e: e + len(drafted)]
            same = drafted[: len(truth)] == truth
            m[e] = len(same) if same.all() else int(np.argmin(same))
            proposer.on_accepted(0, output[e: e + 1].copy())
        proposer.remove_request(0)
        out[request.index] = m
    return out, seconds, calls


def best_schedule(m: np.ndarray, n: int, ks: list[int], cost: CostModel) -> tuple[float, list[int]]:
    """Least decode time from point 1 (the prefill gave the first token) to ``n`` and the K of
    each step on that path. A step at K from point e emits min(K, m(e), n − e − 1) + 1 tokens and
    costs ``verify_s(1, K)``, plus ``switch_s(1)`` when K differs from the previous step's — and
    on the first step, which follows a prefill (as the replay prices it)."""
    if n <= 1:
        return 0.0, []
    verify = {k: cost.verify_s(1, k) for k in ks}
    switch = cost.switch_s(1)
    col = {k: i for i, k in enumerate(ks)}

    def advance(e: int, k: int) -> int:
        return e + min(k, int(m[e]), n - e - 1) + 1

    # best[e, j]: least time from point e to n when the previous step verified ks[j]
    best = np.full((n + 1, len(ks)), np.inf)
    choice = np.zeros((n + 1, len(ks)), dtype=np.int64)
    best[n, :] = 0.0
    for e in range(n - 1, 0, -1):
        for j, previous in enumerate(ks):
            for k in ks:
                t = verify[k] + (switch if k != previous else 0.0) + best[advance(e, k), col[k]]
                if t < best[e, j]:
                    best[e, j], choice[e, j] = t, k
    first = min(ks, key=lambda k: verify[k] + switch + best[advance(1, k), col[k]])
    total = verify[first] + switch + best[advance(1, first), col[first]]
    schedule, e, k = [first], advance(1, first), first
    while e < n:
        k = int(choice[e, col[k]])
        schedule.append(k)
        e = advance(e, k)
    return float(total), schedule


def oracle(pm, run, cost: CostModel, ks: list[int] | None = None) -> tuple[OracleSchedule, float, int]:
    """The best schedule of every request of ``run`` over ``ks`` (default: the run's K-list),
    priced by ``cost`` at batch size 1; also the proposer's seconds and calls (see
    :func:`match_lengths`)."""
    from spdflow.engine.run import Engine, NullUI, RunOptions

    if run.recipe.workload.temperature != 0:
        raise UsageError("the oracle needs a greedy run (temperature 0): a sampled run's token path depends on the "
                         "schedule")
    if run.recipe.proposer is None:
        raise UsageError("the oracle needs a run with a proposer: without one every step is K = 0")
    ks = sorted(set(ks or run.recipe.k_list()) | {0})
    info = run.model_info
    engine = Engine(pm, run.loaded, RunOptions(), NullUI())
    from spdflow.api import Sampling

    proposer = engine.make_proposer(info, Sampling(0.0, None, None), dict(run.outputs))
    try:
        lengths, seconds, calls = match_lengths(pm, run, proposer, max(ks))
    finally:
        proposer.close()
        engine.close_sessions()
    total, steps, usage, schedules = 0.0, 0, {}, {}
    for request in run.requests:
        n = len(run.outputs[request.index])
        t, schedule = best_schedule(lengths[request.index], n, ks, cost)
        total += t
        steps += len(schedule)
        schedules[request.index] = schedule
        for k in schedule:
            usage[k] = usage.get(k, 0) + 1
    return OracleSchedule(total, steps, dict(sorted(usage.items())), schedules), seconds, calls


@dataclass
class OracleReport:
    """The oracle beside the policy, no-spec and every fixed K, all priced by one cost model."""

    oracle_tokens_per_s: float
    oracle_steps: int
    oracle_k_usage: dict[int, int]
    policy: str
    policy_tokens_per_s: float
    nospec_tokens_per_s: float
    fixed_tokens_per_s: dict[int, float]
    efficiency: float  # policy ÷ oracle
    regret: float  # policy ÷ max(no-spec, best fixed K) − 1

    def to_json(self) -> dict:
        return {"oracle_tokens_per_s": self.oracle_tokens_per_s, "oracle_steps": self.oracle_steps,
                "oracle_k_usage": {str(k): v for k, v in self.oracle_k_usage.items()}, "policy": self.policy,
                "policy_tokens_per_s": self.policy_tokens_per_s, "nospec_tokens_per_s": self.nospec_tokens_per_s,
                "fixed_tokens_per_s": {str(k): v for k, v in self.fixed_tokens_per_s.items()},
                "policy_efficiency": self.efficiency, "regret_vs_best_static": self.regret}


def oracle_report(pm, run, cost: CostModel, policy: str | None = None) -> OracleReport:
    """Replay the run's policy, no-spec and each fixed K of its list at batch 1, and the oracle,
    all with ``cost``; the oracle's wall time takes its prefill and per-step host and proposer
    time from the largest fixed K's replay."""
    from spdflow.recipe.schema import REFERENCE_POLICY
    from spdflow.whatif import Scenario, prepare, replay

    ks = sorted(set(run.recipe.k_list()) | {0})
    policy = policy or run.recipe.k_policy.uses
    # a one-K list leaves any policy one choice: K-list [0] is no-spec, [k] is fixed K = k
    scenarios = [Scenario(tuple(ks), policy, 1), Scenario((0,), REFERENCE_POLICY, 1)]
    scenarios += [Scenario((k,), REFERENCE_POLICY, 1) for k in ks if k > 0]
    prepare(cost, scenarios)
    figures = [replay(pm, run, s, cost).figures for s in scenarios]
    mine, nospec, fixed = figures[0], figures[1], figures[2:]
    best, _, _ = oracle(pm, run, cost, ks)
    # outside the verifies, each oracle step costs what a step of the largest fixed K cost in its
    # replay (the proposer drafts its full budget every step, as for the oracle; no policy work),
    # and the prefill is the same for every schedule
    reference = fixed[-1] if fixed else mine
    per_step = (reference.host_s + reference.propose_s) / reference.steps if reference.steps else 0.0
    outside = reference.wall_s - reference.verify_s - reference.host_s - reference.propose_s
    wall = outside + best.verify_s + best.steps * per_step
    oracle_tps = mine.generated_tokens / wall
    fixed_tps = {s.k_list[0]: f.tokens_per_s for s, f in zip(scenarios[2:], fixed)}
    static = max([nospec.tokens_per_s, *fixed_tps.values()])
    return OracleReport(oracle_tps, best.steps, best.k_usage, policy, mine.tokens_per_s, nospec.tokens_per_s,
                        fixed_tps, mine.tokens_per_s / oracle_tps, mine.tokens_per_s / static - 1)
