"""Built-in acceptance methods (greedy, rejection) and K policies (smallest_covering,
goodput, fixed, nospec), registered exactly as a third-party plugin would register its own."""
from __future__ import annotations

from spdflow.hookspecs import hookimpl

from .acceptance import GreedyAcceptor, RejectionAcceptor, target_distribution
from .goodput import AcceptanceEstimator, Goodput, GoodputConfig, StepCostModel
from .k_policy import FixedK, NoSpec, SmallestCovering, smallest_covering_k

__all__ = [
    "GreedyAcceptor",
    "RejectionAcceptor",
    "target_distribution",
    "SmallestCovering",
    "FixedK",
    "NoSpec",
    "Goodput",
    "GoodputConfig",
    "StepCostModel",
    "AcceptanceEstimator",
    "smallest_covering_k",
]


@hookimpl
def spdflow_register_acceptors(register):
    register(
        "greedy",
        GreedyAcceptor,
        description="Keep the proposal prefix equal to the target's argmax, plus one target token.",
    )
    register(
        "rejection",
        RejectionAcceptor,
        description="Lossless speculative sampling (Leviathan/Chen) with temperature, top-k, "
        "top-p; greedy at temperature 0.",
    )


@hookimpl
def spdflow_register_k_policies(register):
    register(
        "smallest_covering",
        SmallestCovering,
        description="varK: the smallest compiled K covering the batch's largest proposal.",
    )
    register(
        "goodput",
        Goodput,
        config=GoodputConfig,
        description="Cost-aware varK: the compiled K with the most expected tokens per second, "
        "from measured step costs and per-position acceptance; skips proposing when it cannot pay.",
    )
    register("fixed", FixedK, description="Always the largest compiled K.")
    register("nospec", NoSpec, description="Always K = 0 (needs 0 in the K-list).")
