"""The built-in specialize stage (plugins/spdflow_shapes) against DESIGN §4."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spdflow.api import Specialization
from spdflow_qaic.formats import specializations_document
from spdflow_shapes import specialize, spdflow_specialize


def flat(specs):
    return specializations_document(specs, "flat")["specializations"]


def shape(batch, seq, ctx=128, nlk=1, fbs=None):
    doc = {"batch_size": str(batch), "seq_len": str(seq), "ctx_len": str(ctx), "num_logits_to_keep": str(nlk)}
    if fbs is not None:
        doc["full_batch_size"] = str(fbs)
    return doc


@pytest.mark.parametrize(
    "ks, decode_seq_lens",
    [(3, [4]), ([0, 4], [1, 5]), ([4, 0, 4], [1, 5]), ([1, 2, 4, 7], [2, 3, 5, 8])],
)
def test_specialize_prefill_then_one_decode_per_k_ascending(ks, decode_seq_lens):
    specs = specialize(ks, prefill_seq_len=32, ctx_len=128, batch_size=1, full_batch_size=None)
    assert flat(specs) == [shape(1, 32)] + [shape(1, n, nlk=n) for n in decode_seq_lens]
    assert [s.kind for s in specs] == ["prefill"] + ["decode"] * len(decode_seq_lens)
    assert [s.k for s in specs[1:]] == [n - 1 for n in decode_seq_lens]


@pytest.mark.parametrize(
    "ks, decode_seq_lens",
    [(3, [4]), ([0, 4], [1, 5]), ([4, 0, 4], [1, 5]), ([1, 2, 4, 7], [2, 3, 5, 8])],
)
def test_specialize_continuous_batching_prefills_at_batch_1_and_decodes_at_full_batch(ks, decode_seq_lens):
    specs = specialize(ks, prefill_seq_len=32, ctx_len=128, batch_size=2, full_batch_size=4)
    prefill = {**shape(1, 32, fbs=4), "full_batch_exec_size": "1"}  # QEfficient's CB prefill symbol
    assert flat(specs) == [prefill] + [shape(4, n, nlk=n, fbs=4) for n in decode_seq_lens]


def test_specialize_keeps_decode_when_k_plus_1_equals_prefill_seq_len():
    specs = specialize([3], prefill_seq_len=4, ctx_len=64, batch_size=1, full_batch_size=None)
    assert flat(specs) == [shape(1, 4, 64, 1), shape(1, 4, 64, 4)]


def test_specialize_dedupes_on_the_full_symbol_tuple():
    # prefill_seq_len 1 and K 0 give the same graph twice: it is compiled once.
    specs = specialize([0], prefill_seq_len=1, ctx_len=16, batch_size=1, full_batch_size=None)
    assert flat(specs) == [shape(1, 1, 16, 1)]


def test_specialize_uses_batch_size_without_continuous_batching():
    specs = specialize([0, 2], prefill_seq_len=8, ctx_len=64, batch_size=3, full_batch_size=None)
    assert [s.batch_size for s in specs] == [3, 3, 3]
    assert all(s.full_batch_size is None for s in specs)


def test_specialize_rejects_prefill_shorter_than_largest_k_plus_1():
    with pytest.raises(ValueError, match="prefill_seq_len 4 is shorter than the largest K"):
        specialize([0, 4], prefill_seq_len=4, ctx_len=128, batch_size=1, full_batch_size=None)


def test_specialize_rejects_ctx_len_not_above_prefill_seq_len():
    with pytest.raises(ValueError, match="ctx_len 32 must be larger than prefill_seq_len 32"):
        specialize([0], prefill_seq_len=32, ctx_len=32, batch_size=1, full_batch_size=None)


def test_specialize_rejects_negative_k():
    with pytest.raises(ValueError, match="non-negative"):
        specialize([-1], prefill_seq_len=32, ctx_len=128, batch_size=1, full_batch_size=None)


def test_spdflow_specialize_hook_calls_specialize():
    kwargs = dict(num_speculative_tokens=[4, 0], prefill_seq_len=32, ctx_len=128, batch_size=1, full_batch_size=4)
    assert spdflow_specialize(**kwargs) == specialize(**kwargs)


def test_specialize_serves_a_draft_model_k_list():
    # A draft model decodes 1 token, or 2 to catch up a skipped one (the cloud-ai-sdk DLM).
    specs = specialize([0, 1], prefill_seq_len=32, ctx_len=128, batch_size=1, full_batch_size=None)
    assert [s.seq_len for s in specs] == [32, 1, 2]


@given(
    ks=st.lists(st.integers(0, 15), min_size=1, max_size=6),
    prefill=st.integers(16, 40),
    fbs=st.one_of(st.none(), st.integers(1, 8)),
)
def test_specialize_properties(ks, prefill, fbs):
    specs = specialize(ks, prefill_seq_len=prefill, ctx_len=prefill + 1, batch_size=1, full_batch_size=fbs)
    assert specs[0].kind == "prefill" and specs[0].seq_len == prefill and specs[0].num_logits_to_keep == 1
    decodes = specs[1:]
    assert [s.k for s in decodes] == sorted(set(ks))
    assert all(s.seq_len == s.num_logits_to_keep == s.k + 1 for s in decodes)
    assert len({tuple(s.symbols().items()) for s in specs}) == len(specs)
    assert all(isinstance(s, Specialization) for s in specs)
