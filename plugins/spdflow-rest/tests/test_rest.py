"""The REST index and proposer without the engine: suffix array, lookup, cache, config."""
from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from spdflow.api import ProposeInput
from spdflow.errors import RecipeError
from spdflow.zoo import zoo_path
from spdflow_rest import RestConfig, build_suffix_array, load_or_build_index, make_rest
from spdflow_rest.index import SEP, CorpusIndex

TOKENIZER = zoo_path("tinycode-target") / "tokenizer.json"


def index_of(tokens, depth=8) -> CorpusIndex:
    stream = np.asarray(list(tokens) + [SEP], dtype=np.uint32)
    order = build_suffix_array(stream, depth)
    padded = np.concatenate((stream, np.full(depth, SEP, dtype=np.uint32)))
    return CorpusIndex(padded, order[stream[order] != SEP].astype(np.int64), depth)


def test_suffix_array_sorts_positions_by_their_next_depth_tokens():
    rng = np.random.default_rng(0)
    for _ in range(100):
        stream = rng.integers(0, 3, size=int(rng.integers(1, 40))).astype(np.uint32)
        depth = int(rng.integers(1, 8))
        order = build_suffix_array(stream, depth)
        keys = [stream[i : i + depth].tolist() for i in order]
        assert sorted(order.tolist()) == list(range(len(stream)))
        assert keys == sorted(keys)


def test_longest_match_prefers_the_longest_suffix():
    index = index_of([5, 6, 7, 8, 1, 6, 7, 9])
    m, lo, hi = index.longest_match(np.array([4, 5, 6, 7]), 1, 4)
    assert m == 3 and hi - lo == 1  # "5 6 7" occurs once; "4 5 6 7" never


def test_continuation_takes_the_most_frequent_branch_and_stops_at_documents_end():
    index = index_of([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 5])
    match = index.longest_match(np.array([9, 1, 2]), 1, 4)
    assert index.continuation(*match, 8, 1, 0.0).tolist() == [3, 4, 1, 2, 3, 4, 1, 2][: 8 - 0][:6]


def test_continuation_stops_below_min_count():
    index = index_of([1, 2, 3, 1, 2, 4])
    match = index.longest_match(np.array([1, 2]), 1, 4)
    assert index.continuation(*match, 4, 2, 0.0).tolist() == []


def make_ctx(tmp_path, base_dir=None):
    target = SimpleNamespace(tokenizer_file=TOKENIZER, vocab_size=4096, name="tiny")
    return SimpleNamespace(target=target, run_dir=tmp_path / "run", base_dir=base_dir)


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.py").write_text("def add(a, b):\n    return a + b\n" * 3)
    (folder / "b.bin").write_bytes(b"\x00\x01binary")
    return folder


def test_rest_proposes_the_corpus_continuation(tmp_path):
    from tokenizers import Tokenizer

    proposer = make_rest(RestConfig(corpus=str(write_corpus(tmp_path / "corpus"))), make_ctx(tmp_path))
    ids = Tokenizer.from_file(str(TOKENIZER)).encode("x = 1\ndef add(a, b):\n    return", add_special_tokens=False).ids
    [proposal] = proposer.propose([ProposeInput(0, 0, np.asarray(ids), len(ids), 4)])
    assert 0 < len(proposal.tokens) <= 4
    assert proposer.propose([ProposeInput(0, 0, np.asarray(ids), len(ids), 0)])[0].tokens.size == 0


def test_index_is_reused_on_the_next_run_and_rebuilt_when_corrupt(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    build = lambda: load_or_build_index(corpus, "**/*", TOKENIZER, 1000, 8, tmp_path / "cache")
    first = build()
    assert first.info["cached"] is False and first.info["documents"] == 1  # the binary file is skipped
    assert build().info["cached"] is True
    Path(first.info["path"]).write_bytes(b"not an npz")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = build()
    assert again.info["cached"] is False and "unusable" in str(caught[0].message)
    (corpus / "a.py").write_text("changed = True\n")
    assert build().info["key"] != first.info["key"]


def test_relative_corpus_resolves_against_the_recipe_folder(tmp_path):
    write_corpus(tmp_path / "recipes" / "corpus")
    proposer = make_rest(RestConfig(corpus="corpus"), make_ctx(tmp_path, base_dir=tmp_path / "recipes"))
    assert proposer.index.num_tokens > 0


def test_missing_corpus_is_a_recipe_error_naming_the_path(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        make_rest(RestConfig(corpus="nowhere"), make_ctx(tmp_path, base_dir=tmp_path))


def test_config_rejects_min_above_max_suffix_len():
    with pytest.raises(ValidationError, match="min_suffix_len"):
        RestConfig(corpus="c", min_suffix_len=5, max_suffix_len=4)
