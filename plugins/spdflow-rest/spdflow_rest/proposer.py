"""The ``rest`` proposer: continuation of the context's longest suffix in the corpus index."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from spdflow.api import Proposal, ProposeInput, Proposer
from spdflow.errors import RecipeError, StageError

from spdflow_rest.config import RestConfig
from spdflow_rest.index import CorpusIndex, load_or_build_index


class RestProposer(Proposer):
    """Stateless between steps: a proposal depends only on the context and the index, so
    rejections and K = 0 steps need no bookkeeping."""

    name = "rest"
    may_propose_nothing = True

    def __init__(self, config: RestConfig, index: CorpusIndex, vocab_size: int):
        self.config = config
        self.index = index
        self.vocab_size = vocab_size

    def propose(self, inputs: Sequence[ProposeInput]) -> list[Proposal]:
        return [self._propose_one(item) for item in inputs]

    def _propose_one(self, item: ProposeInput) -> Proposal:
        cfg = self.config
        limit = min(item.k_max, cfg.max_proposal_len)
        if limit <= 0:
            return Proposal.empty()
        match = self.index.longest_match(np.asarray(item.tokens), cfg.min_suffix_len, cfg.max_suffix_len)
        if match is None:
            return Proposal.empty()
        tokens = self.index.continuation(*match, limit, cfg.min_count, cfg.min_token_prob)
        # An index built with another tokenizer could hold ids the target lacks: never propose them.
        out_of_vocab = np.flatnonzero(tokens >= self.vocab_size)
        if len(out_of_vocab):
            tokens = tokens[: out_of_vocab[0]]
        return Proposal(tokens)


def resolve_corpus(corpus: str, base_dir: Path | None) -> Path:
    """``corpus`` as an absolute path: relative paths are taken from the recipe's folder
    (``ctx.base_dir``), or the current directory when the engine does not say."""
    path = Path(corpus).expanduser()
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    if not path.exists():
        raise RecipeError(
            f"REST corpus '{corpus}' does not exist (looked at '{path}')",
            hint="proposer.with.corpus is a directory of text or code, relative to the recipe's folder",
        )
    return path


def make_rest(config: RestConfig, ctx) -> RestProposer:
    """Factory registered as ``rest``: resolves the corpus and loads (or builds) its index
    under ``<run dir>/rest-index/``."""
    corpus = resolve_corpus(config.corpus, getattr(ctx, "base_dir", None))
    tokenizer_file = ctx.target.tokenizer_file
    if tokenizer_file is None or not Path(tokenizer_file).is_file():
        raise StageError(f"the REST proposer needs the target's tokenizer.json; model '{ctx.target.name}' has none")
    index = load_or_build_index(corpus, config.glob, Path(tokenizer_file), config.max_corpus_tokens,
                                config.index_depth(), Path(ctx.run_dir) / "rest-index", config.exclude)
    if index.num_tokens == 0:
        raise StageError(f"the REST corpus '{corpus}' has no text files matching '{config.glob}'",
                         hint="check proposer.with.corpus and proposer.with.glob")
    return RestProposer(config, index, ctx.target.vocab_size)
