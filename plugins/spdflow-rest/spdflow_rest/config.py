"""The ``with:`` block of ``proposer: {uses: rest}``."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RestConfig(BaseModel):
    """Settings of the REST proposer. Index-shaping fields are part of the index's cache key."""

    model_config = ConfigDict(extra="forbid")

    corpus: str = Field(
        description="Directory (or single file) of text or code to retrieve from; a relative "
        "path is resolved against the recipe's folder."
    )
    glob: str = Field(
        "**/*",
        description="Which files under the corpus directory to index (pathlib glob, e.g. '**/*.py'); "
        "binary and non-UTF-8 files are skipped.",
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="fnmatch patterns of paths (relative to the corpus, '/'-separated) to leave "
        "out, e.g. ['site-packages/*', 'test/*'].",
    )
    max_corpus_tokens: int = Field(
        2_000_000, ge=1,
        description="Stop reading files (in sorted path order) once the index holds this many tokens.",
    )
    max_suffix_len: int = Field(
        16, ge=1, le=256, description="Longest suffix of the context to look up in the corpus."
    )
    min_suffix_len: int = Field(
        2, ge=1, description="Shortest suffix worth a proposal; shorter matches propose nothing."
    )
    max_proposal_len: int = Field(
        16, ge=1, le=256, description="Propose at most this many tokens (and at most the step's k_max)."
    )
    min_count: int = Field(
        1, ge=1, description="Stop the proposal when its next token has fewer occurrences than this."
    )
    min_token_prob: float = Field(
        0.1, ge=0.0, le=1.0,
        description="Stop the proposal when its next token's share among the remaining matches "
        "falls below this.",
    )

    @model_validator(mode="after")
    def _min_le_max(self):
        if self.min_suffix_len > self.max_suffix_len:
            raise ValueError(
                f"min_suffix_len ({self.min_suffix_len}) is larger than max_suffix_len ({self.max_suffix_len})"
            )
        return self

    def index_depth(self) -> int:
        """How many leading tokens the suffix array sorts by: a match plus its proposal."""
        return self.max_suffix_len + self.max_proposal_len
