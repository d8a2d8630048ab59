"""Built-in proposers: prompt_lookup, suffix, synthetic, draft_model, multi_projection, eagle.

Each registers with its own pydantic config model (the recipe's ``proposer.with:`` block), the
same way a third-party proposer plugin would. Importing this package stays light (numpy and
pydantic); the draft model's session is built by the engine only when a run starts.
"""
from __future__ import annotations

from spdflow.hookspecs import hookimpl

from .draft_model import DraftModelConfig, DraftModelProposer, make_draft_model
from .eagle import EagleConfig, EagleProposer
from .multi_projection import MultiProjectionConfig, MultiProjectionProposer
from .prompt_lookup import (PromptLookupConfig, PromptLookupProposer, find_continuation, find_matched_continuation,
                            make_prompt_lookup)
from .suffix import SuffixConfig, SuffixProposer, SuffixTrie
from .synthetic import SyntheticConfig, SyntheticProposer, make_synthetic

__all__ = [
    "DraftModelConfig",
    "DraftModelProposer",
    "EagleConfig",
    "EagleProposer",
    "MultiProjectionConfig",
    "MultiProjectionProposer",
    "PromptLookupConfig",
    "PromptLookupProposer",
    "SuffixConfig",
    "SuffixProposer",
    "SuffixTrie",
    "SyntheticConfig",
    "SyntheticProposer",
    "find_continuation",
    "find_matched_continuation",
]


def make_suffix(config: SuffixConfig, ctx) -> SuffixProposer:
    """Factory registered as ``suffix``."""
    return SuffixProposer(config)


@hookimpl
def spdflow_register_proposers(register):
    register(
        "prompt_lookup",
        make_prompt_lookup,
        config=PromptLookupConfig,
        description="n-gram lookup in the request's own context (longest continuation wins).",
        aliases=("ngram",),  # vLLM's speculative method name for the same idea
    )
    register(
        "suffix",
        make_suffix,
        config=SuffixConfig,
        description="Suffix decoding (ArcticInference): frequency-ranked continuations from "
        "per-request suffix tries and a cache of earlier outputs.",
    )
    register(
        "synthetic",
        make_synthetic,
        config=SyntheticConfig,
        description="Proposals around the target's greedy output with a configured acceptance "
        "rate, to model proposers that do not exist yet.",
    )
    register(
        "draft_model",
        make_draft_model,
        config=DraftModelConfig,
        description="A small draft LM with the target's tokenizer, compiled with the same stages.",
    )
    register(
        "multi_projection",
        MultiProjectionProposer,
        config=MultiProjectionConfig,
        description="QEfficient 'Turbo' / Medusa heads on the target's last hidden state, run inside "
        "the verify pass (logits [batch, nlk, heads+1, vocab]).",
    )
    register(
        "eagle",
        EagleProposer,
        config=EagleConfig,
        description="EAGLE-1-style draft layer on the target's hidden states (own ONNX program and KV cache), "
        "drafting autoregressively.",
    )
