"""``spdflow advise``: which K-list to compile, from replays of recorded runs.

Every K-list with at most ``max_shapes`` decode shapes drawn from 0..K_max, under every K policy
asked for, is replayed (:func:`spdflow.whatif.replay`) over every run at every batch size asked
for, and priced by each run's cost model. A candidate's score is the geometric mean over (run,
batch size) of its predicted tokens/s over no-spec's, times ``(1 - per_shape_cost)`` for every
decode shape beyond the first (compile time and device memory grow with each shape). A list
with one K is fixed-K SpD under any policy, so singletons are replayed once, with
``smallest_covering``.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from spdflow.errors import UsageError
from spdflow.recipe.schema import REFERENCE_POLICY
from spdflow.whatif import Prediction, RunData, Scenario, prepare, replay


@dataclass
class Candidate:
    """One K-list under one policy, with its predictions per (run index, batch size)."""

    k_list: tuple[int, ...]
    policy: str
    predictions: dict[tuple[int, int], Prediction] = field(default_factory=dict)
    speedup: float = 0.0  # geometric mean of predicted tokens/s ÷ no-spec's
    score: float = 0.0  # speedup with the per-shape cost

    @property
    def shapes(self) -> int:
        return len(self.k_list)

    def recipe_lines(self) -> str:
        return f"num_speculative_tokens: {list(self.k_list)}\nk_policy: {self.policy}"


@dataclass
class Advice:
    ranked: list[Candidate]
    nospec: dict[tuple[int, int], Prediction]
    best_fixed: dict[tuple[int, int], Candidate]  # the best single K per (run, batch)
    batch_sizes: list[int]
    k_max: int
    max_shapes: int
    per_shape_cost: float


def candidate_lists(k_max: int, max_shapes: int) -> list[tuple[int, ...]]:
    """Every K-list of 1..max_shapes distinct K in 0..k_max with at least one K > 0."""
    if k_max < 1:
        raise UsageError("--k-max must be at least 1")
    if max_shapes < 1:
        raise UsageError("--max-shapes must be at least 1")
    lists = []
    for size in range(1, max_shapes + 1):
        lists += [c for c in itertools.combinations(range(k_max + 1), size) if c[-1] > 0]
    return lists


def tokens_per_s(prediction: Prediction) -> float:
    return prediction.figures.tokens_per_s or 0.0


def advise(pm, runs: Sequence[RunData], costs: Sequence, batch_sizes: Sequence[int], *, max_shapes: int,
           k_max: int, policies: Sequence[str], per_shape_cost: float = 0.0,
           progress: Callable[[str], None] = lambda text: None) -> Advice:
    """Replay every candidate over every run and batch size; candidates best first."""
    if not 0.0 <= per_shape_cost < 1.0:
        raise UsageError("--per-shape-cost must be in [0, 1)")
    for name in policies:
        pm.lookup("k_policy", name)
    lists = candidate_lists(k_max, max_shapes)
    cells = [(i, b) for i in range(len(runs)) for b in batch_sizes]
    for run, cost in zip(runs, costs):
        prepare(cost, [Scenario(tuple(range(k_max + 1)), REFERENCE_POLICY, b) for b in batch_sizes])
    # a one-K list leaves any policy one choice: K-list [0] is no-spec, [k] is fixed K = k
    nospec = {(i, b): replay(pm, runs[i], Scenario((0,), REFERENCE_POLICY, b), costs[i]) for i, b in cells}
    candidates = []
    for ks in lists:
        for policy in ([REFERENCE_POLICY] if len(ks) == 1 else policies):
            candidate = Candidate(ks, policy)
            for i, b in cells:
                candidate.predictions[(i, b)] = replay(pm, runs[i], Scenario(ks, policy, b), costs[i])
            ratios = [max(tokens_per_s(candidate.predictions[c]), 1e-9) / max(tokens_per_s(nospec[c]), 1e-9)
                      for c in cells]
            candidate.speedup = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            candidate.score = candidate.speedup * (1.0 - per_shape_cost) ** (len(ks) - 1)
            candidates.append(candidate)
            progress(f"{list(ks)} {policy}: {candidate.speedup:.3f}x no-spec")
    fixed = [c for c in candidates if len(c.k_list) == 1]
    best_fixed = {cell: max(fixed, key=lambda c: tokens_per_s(c.predictions[cell])) for cell in cells}
    ranked = sorted(candidates, key=lambda c: (-c.score, len(c.k_list), c.k_list, c.policy))
    return Advice(ranked, nospec, best_fixed, list(batch_sizes), k_max, max_shapes, per_shape_cost)


def render_advice(advice: Advice, runs: Sequence[RunData], top: int) -> str:
    """The ranked table, the no-spec and best fixed-K rows it is compared with, and recipe lines."""
    cells = list(advice.nospec)
    label = {c: (f"b{c[1]}" if len(runs) == 1 else f"run{c[0] + 1} b{c[1]}") for c in cells}
    head = "| rank | K-list | policy | shapes | " + " | ".join(f"{label[c]} tok/s" for c in cells) + \
           " | vs no-spec | vs best fixed K | score |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def row(rank, candidate: Candidate):
        values = " | ".join(f"{tokens_per_s(candidate.predictions[c]):.1f}" for c in cells)
        vs_fixed = [tokens_per_s(candidate.predictions[c]) / max(tokens_per_s(advice.best_fixed[c].predictions[c]), 1e-9)
                    for c in cells]
        fixed_gain = math.exp(sum(math.log(max(v, 1e-9)) for v in vs_fixed) / len(vs_fixed)) - 1
        lines.append(f"| {rank} | {list(candidate.k_list)} | {candidate.policy} | {candidate.shapes} | {values} | "
                     f"{candidate.speedup - 1:+.1%} | {fixed_gain:+.1%} | {candidate.score:.3f} |")

    for rank, candidate in enumerate(advice.ranked[:top], 1):
        row(rank, candidate)
    lines.append("")
    lines.append("no-spec: " + ", ".join(f"{label[c]} {tokens_per_s(advice.nospec[c]):.1f} tok/s" for c in cells))
    lines.append("best fixed K: " + ", ".join(f"{label[c]} K={advice.best_fixed[c].k_list[0]} "
                                               f"{tokens_per_s(advice.best_fixed[c].predictions[c]):.1f} tok/s"
                                               for c in cells))
    best = advice.ranked[0]
    lines.append("")
    lines.append("recipe lines for the best list:")
    lines.append("")
    lines += ["    " + line for line in best.recipe_lines().splitlines()]
    inexact = sorted({n for c in advice.ranked[:top] for p in c.predictions.values() for n in p.notes})
    lines += [""] + [f"note: {n}" for n in inexact] if inexact else []
    return "\n".join(lines)


def advice_json(advice: Advice, runs: Sequence[RunData], top: int) -> dict:
    def cell(c):
        return {"run_dir": str(runs[c[0]].run_dir), "batch_size": c[1]}

    return {
        "k_max": advice.k_max, "max_shapes": advice.max_shapes, "per_shape_cost": advice.per_shape_cost,
        "nospec": [{**cell(c), "tokens_per_s": tokens_per_s(p)} for c, p in advice.nospec.items()],
        "best_fixed": [{**cell(c), "k": cand.k_list[0], "tokens_per_s": tokens_per_s(cand.predictions[c])}
                       for c, cand in advice.best_fixed.items()],
        "ranked": [{"k_list": list(c.k_list), "policy": c.policy, "shapes": c.shapes, "speedup_vs_nospec": c.speedup,
                    "score": c.score, "recipe": c.recipe_lines(),
                    "cells": [{**cell(k), **p.to_json()} for k, p in c.predictions.items()]}
                   for c in advice.ranked[:top]],
    }
