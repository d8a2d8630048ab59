"""spdflow-rest: the ``rest`` proposer (REST, He et al. 2023, arXiv 2311.08252).

Retrieval-based speculative decoding: index a corpus once (a suffix array over its tokens),
then at every step find the longest suffix of the request's context in the corpus and propose
the most frequent continuation among its occurrences. No draft model; the corpus is the draft.

This module is the plugin: the ``spdflow`` entry point of this distribution names it, and its
one hook implementation registers the proposer.
"""
from __future__ import annotations

from spdflow.hookspecs import hookimpl

from spdflow_rest.config import RestConfig
from spdflow_rest.index import CorpusIndex, build_suffix_array, load_or_build_index
from spdflow_rest.proposer import RestProposer, make_rest

__all__ = ["CorpusIndex", "RestConfig", "RestProposer", "build_suffix_array", "load_or_build_index", "make_rest"]


@hookimpl
def spdflow_register_proposers(register):
    register(
        "rest",
        make_rest,
        config=RestConfig,
        description="REST: continuations of the context's longest suffix in a corpus index "
        "(a suffix array over a directory of text or code).",
    )
