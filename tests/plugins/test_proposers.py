"""Built-in proposers: prompt_lookup, suffix, synthetic, draft_model (with a fake Session)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from spdflow.api import ModelInfo, ProposeInput, ProposerContext, Request, Sampling, Specialization
from spdflow.errors import RecipeError
from spdflow.plugins import get_plugin_manager
from spdflow_proposers import (
    DraftModelConfig,
    PromptLookupConfig,
    PromptLookupProposer,
    SuffixConfig,
    SuffixProposer,
    SuffixTrie,
    SyntheticConfig,
    find_continuation,
)
from spdflow_proposers.draft_model import make_draft_model
from spdflow_proposers.synthetic import make_synthetic

V = 50


def _info(name="target", vocab=V, tokenizer=None) -> ModelInfo:
    return ModelInfo(name, "llama", vocab, 2, 1, 8, (0,), 1, Path("."), tokenizer)


def _ctx(**kw) -> ProposerContext:
    fields = dict(recipe=None, target=_info(), sampling=Sampling(), run_dir=Path("."))
    fields.update(kw)
    return ProposerContext(**fields)


def _request(index, prompt, max_new_tokens=32, seed=0):
    return Request(index, "", np.asarray(prompt, dtype=np.int64), max_new_tokens, seed)


def _input(tokens, num_prompt, k_max, slot=0, index=0):
    return ProposeInput(slot, index, np.asarray(tokens, dtype=np.int64), num_prompt, k_max)


# ---------------------------------------------------------------------------- registration


def test_every_proposer_is_registered_with_a_strict_described_config():
    registry = get_plugin_manager().registry()["proposer"]
    assert {"prompt_lookup", "suffix", "synthetic", "draft_model"} <= set(registry)
    for name in ("prompt_lookup", "suffix", "synthetic", "draft_model"):
        config = registry[name].config
        assert config.model_config.get("extra") == "forbid", name
        for field_name, field in config.model_fields.items():
            assert field.description, f"{name}.{field_name} has no description"


@pytest.mark.parametrize(
    "config, good",
    [
        (PromptLookupConfig, {}),
        (SuffixConfig, {}),
        (SyntheticConfig, {}),
        (DraftModelConfig, {"model": "spdflow:tinycode-draft"}),
    ],
)
def test_configs_reject_unknown_keys(config, good):
    config.model_validate(good)
    with pytest.raises(ValidationError, match="bogus"):
        config.model_validate({**good, "bogus": 1})


def test_prompt_lookup_config_rejects_min_above_max_and_zero():
    assert PromptLookupConfig().prompt_lookup_min == 1 and PromptLookupConfig().prompt_lookup_max == 3
    with pytest.raises(ValidationError, match="larger than"):
        PromptLookupConfig(prompt_lookup_min=4, prompt_lookup_max=2)
    with pytest.raises(ValidationError):
        PromptLookupConfig(prompt_lookup_min=0)


# ---------------------------------------------------------------------------- prompt_lookup


def _lookup(tokens, k_max, n_min=1, n_max=3, num_prompt=None, lookup_in="all"):
    proposer = PromptLookupProposer(PromptLookupConfig(prompt_lookup_min=n_min, prompt_lookup_max=n_max, lookup_in=lookup_in))
    num_prompt = len(tokens) if num_prompt is None else num_prompt
    return proposer.propose([_input(tokens, num_prompt, k_max)])[0].tokens.tolist()


def test_prompt_lookup_returns_the_longest_continuation_among_all_matches():
    # "8 5" (n=2) matched at 8 leaves 3 tokens; "5" (n=1) at 0 leaves 6: the longer one wins.
    tokens = [5, 1, 2, 3, 4, 6, 7, 0, 8, 5, 3, 8, 5]
    assert _lookup(tokens, k_max=6) == [1, 2, 3, 4, 6, 7]


def test_prompt_lookup_breaks_ties_by_larger_n_then_recency():
    tokens = [5, 1, 2, 3, 4, 6, 7, 0, 8, 5, 3, 8, 5]
    assert _lookup(tokens, k_max=3) == [3, 8, 5]  # both give 3 tokens: n=2 beats n=1
    assert _lookup([1, 2, 1, 3, 1], k_max=1) == [3]  # same n and length: the most recent


def test_prompt_lookup_respects_k_max_and_min_ngram():
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert _lookup(tokens, k_max=3) == [3, 4, 5]
    assert _lookup(tokens, k_max=0) == []
    assert _lookup([1, 2, 3, 9, 3], k_max=2, n_min=2) == []  # only a 1-gram matches


def test_prompt_lookup_proposes_nothing_without_a_match_or_from_the_self_match():
    assert _lookup([1, 2, 3, 4], k_max=4) == []
    assert _lookup([7], k_max=4) == []
    assert _lookup([], k_max=4) == []


def test_prompt_lookup_continues_periodic_text():
    # "1 2 1" at 0 leaves 2 tokens, "1" at 0 leaves 4 (capped at 3): the longer one wins
    assert _lookup([1, 2, 1, 2, 1], k_max=3) == [2, 1, 2]
    assert _lookup([4, 4, 4, 4], k_max=2) == [4, 4]


def test_prompt_lookup_in_prompt_only_searches_the_prompt():
    prompt, generated = [4, 5, 6, 1, 2], [4, 7, 8, 9, 4]
    tokens = prompt + generated
    assert _lookup(tokens, k_max=4, num_prompt=5) == [7, 8, 9, 4]  # most recent of equal length
    assert _lookup(tokens, k_max=4, num_prompt=5, lookup_in="prompt") == [5, 6, 1, 2]
    # the continuation is cut at the prompt's end
    assert _lookup([9, 4, 5, 3, 4], k_max=4, num_prompt=3, lookup_in="prompt") == [5]


def _naive_lookup(tokens, k_max, n_min, n_max, search_end):
    """Every (n, i) match, scored (continuation, n, i) exactly as documented."""
    best, best_key = [], None
    length = len(tokens)
    for n in range(n_min, n_max + 1):
        if n >= length:
            break
        pattern = tokens[length - n :]
        for i in range(0, search_end - n):
            if tokens[i : i + n] == pattern:
                cont = tokens[i + n : min(i + n + k_max, search_end)]
                key = (len(cont), n, i)
                if cont and (best_key is None or key > best_key):
                    best, best_key = cont, key
    return best


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=0, max_size=40),
    k_max=st.integers(0, 6),
    n_min=st.integers(1, 3),
    extra=st.integers(0, 2),
    prompt_only=st.booleans(),
)
def test_prompt_lookup_matches_a_naive_search(tokens, k_max, n_min, extra, prompt_only):
    n_max = n_min + extra
    end = len(tokens) // 2 if prompt_only else None
    got = find_continuation(np.asarray(tokens, dtype=np.int64), k_max, n_min, n_max, end)
    want = _naive_lookup(tokens, k_max, n_min, n_max, len(tokens) if end is None else end) if k_max else []
    assert got.tolist() == want


# ---------------------------------------------------------------------------- suffix


def test_suffix_proposal_grows_with_the_match_length():
    block = list(range(10, 30))  # a 20-token stretch seen once in the prompt
    prompt = block + [1, 2, 3]
    lengths = []
    for m in (1, 2, 4, 6):
        proposer = SuffixProposer(SuffixConfig(max_spec_factor=1.0))
        tokens = prompt + block[:m]
        proposer.add_request(0, _request(0, prompt))
        proposer.on_accepted(0, np.asarray(block[:m]))
        proposal = proposer.propose([_input(tokens, len(prompt), k_max=8)])[0].tokens.tolist()
        assert proposal == block[m : m + len(proposal)]
        lengths.append(len(proposal))
    assert lengths == [1, 2, 4, 6]


def test_suffix_follows_the_most_frequent_continuation():
    proposer = SuffixProposer(SuffixConfig(max_spec_factor=4.0))
    prompt = [1, 2, 7, 0, 1, 2, 7, 0, 1, 2, 8, 0, 5, 1, 2]
    proposer.add_request(0, _request(0, prompt))
    assert proposer.propose([_input(prompt, len(prompt), k_max=3)])[0].tokens.tolist()[:1] == [7]


def test_suffix_min_token_prob_stops_on_rare_branches():
    prompt = [1, 2, 7, 0, 1, 2, 8, 0, 1, 2, 9, 0, 1, 2]  # three different continuations of "1 2"
    strict = SuffixProposer(SuffixConfig(min_token_prob=0.5, max_spec_factor=4.0))
    strict.add_request(0, _request(0, prompt))
    assert strict.propose([_input(prompt, len(prompt), k_max=3)])[0].tokens.tolist() == []
    loose = SuffixProposer(SuffixConfig(min_token_prob=0.1, max_spec_factor=4.0))
    loose.add_request(0, _request(0, prompt))
    assert len(loose.propose([_input(prompt, len(prompt), k_max=3)])[0].tokens) > 0


def _finish(proposer, slot, index, prompt, output):
    proposer.add_request(slot, _request(index, prompt))
    proposer.on_accepted(slot, np.asarray(output))
    proposer.remove_request(slot)


def test_suffix_uses_earlier_requests_outputs():
    output = [40, 41, 42, 43, 44, 45, 46]
    prompt2 = [3, 40, 41, 42]  # request 2 starts what request 1 answered
    for cached, expected in ((2, [43, 44, 45]), (0, [])):
        proposer = SuffixProposer(SuffixConfig(max_cached_requests=cached))
        _finish(proposer, 0, 0, [1, 2, 3], output)
        proposer.add_request(1, _request(1, prompt2))
        got = proposer.propose([_input(prompt2, len(prompt2), k_max=5, slot=1, index=1)])[0]
        assert got.tokens.tolist() == expected


def test_suffix_cache_evicts_the_oldest_output_first():
    proposer = SuffixProposer(SuffixConfig(max_cached_requests=1))
    _finish(proposer, 0, 0, [1], [40, 41, 42, 43])
    _finish(proposer, 0, 1, [1], [30, 31, 32, 33])
    proposer.add_request(0, _request(2, [40, 41]))
    assert proposer.propose([_input([40, 41], 2, k_max=3)])[0].tokens.tolist() == []
    proposer.add_request(1, _request(3, [30, 31]))
    assert proposer.propose([_input([30, 31], 2, k_max=3, slot=1)])[0].tokens.tolist() == [32, 33]


def test_suffix_trie_remove_undoes_insert():
    trie = SuffixTrie(max_depth=4)
    trie.insert([1, 2, 3, 1, 2])
    trie.insert([5, 6])
    trie.remove([1, 2, 3, 1, 2])
    assert set(trie.root[1]) == {5, 6}
    trie.remove([5, 6])
    assert trie.root[1] == {}


def test_suffix_rebuilds_when_the_engine_context_disagrees():
    proposer = SuffixProposer(SuffixConfig())
    tokens = [1, 2, 3, 4, 1, 2]
    # no add_request at all: the proposer starts from the context it is given
    assert proposer.propose([_input(tokens, 4, k_max=2)])[0].tokens.tolist() == [3, 4]


# ---------------------------------------------------------------------------- synthetic


def _synthetic(reference, **config):
    return make_synthetic(SyntheticConfig(**config), _ctx(reference_output=lambda i: reference[i]))


def test_synthetic_hits_its_acceptance_rate():
    rng = np.random.default_rng(0)
    reference = {i: rng.integers(0, V, 400) for i in range(4)}
    proposer = _synthetic(reference, acceptance_rate=0.6, seed=3)
    right = total = 0
    for i in range(4):
        proposer.add_request(i, _request(i, [1, 2, 3]))
        generated = [int(reference[i][0])]  # the prefill's token
        while len(generated) < 380:
            tokens = [1, 2, 3] + generated
            proposal = proposer.propose([_input(tokens, 3, k_max=4, slot=i, index=i)])[0].tokens
            truth = reference[i][len(generated) : len(generated) + 4]
            assert len(proposal) == len(truth) == 4
            right += int((proposal == truth).sum())
            total += len(proposal)
            # greedy verification against the reference: matching prefix + one target token
            keep = int(np.cumprod(proposal == truth).sum())
            generated += reference[i][len(generated) : len(generated) + keep + 1].tolist()
    assert abs(right / total - 0.6) < 0.04


def test_synthetic_wrong_tokens_differ_from_the_reference_and_stay_in_vocab():
    reference = {0: np.arange(100) % V}
    proposer = _synthetic(reference, acceptance_rate=0.0)
    proposer.add_request(0, _request(0, [1]))
    for g in range(1, 60):
        tokens = [1] + reference[0][:g].tolist()
        proposal = proposer.propose([_input(tokens, 1, k_max=3)])[0].tokens
        assert ((proposal >= 0) & (proposal < V)).all()
        assert (proposal != reference[0][g : g + 3]).all()


def test_synthetic_never_proposes_at_proposal_rate_zero_and_stops_at_the_reference_end():
    reference = {0: np.arange(10)}
    silent = _synthetic(reference, proposal_rate=0.0)
    silent.add_request(0, _request(0, [1]))
    assert all(len(silent.propose([_input([1] + list(range(g)), 1, 4)])[0].tokens) == 0 for g in range(1, 9))
    full = _synthetic(reference, acceptance_rate=1.0)
    full.add_request(0, _request(0, [1]))
    assert full.propose([_input([1] + list(range(8)), 1, 4)])[0].tokens.tolist() == [8, 9]
    assert full.propose([_input([1] + list(range(10)), 1, 4)])[0].tokens.tolist() == []


def test_synthetic_proposal_rate_is_honoured():
    reference = {0: np.zeros(3000, dtype=np.int64)}
    proposer = _synthetic(reference, proposal_rate=0.3, seed=1)
    proposer.add_request(0, _request(0, [1]))
    made = sum(len(proposer.propose([_input([1] * (g + 1), 1, 2)])[0].tokens) > 0 for g in range(1, 2001))
    assert abs(made / 2000 - 0.3) < 0.04


def test_synthetic_is_reproducible_per_request():
    reference = {0: np.arange(40) % V, 1: np.arange(40) % V}
    a = _synthetic(reference, acceptance_rate=0.5, seed=9)
    b = _synthetic(reference, acceptance_rate=0.5, seed=9)
    a.add_request(0, _request(1, [1]))
    b.add_request(3, _request(1, [1]))  # another slot, same request
    for g in range(1, 20):
        tokens = [1] + list(range(g))
        pa = a.propose([_input(tokens, 1, 3, slot=0, index=1)])[0].tokens
        pb = b.propose([_input(tokens, 1, 3, slot=3, index=1)])[0].tokens
        assert pa.tolist() == pb.tolist()


def test_synthetic_draws_belong_to_positions_not_to_calls():
    """What a step at position p accepts depends on p and K only: a policy that drafts 7 tokens
    and verifies 2, or skips the proposer on some steps, sees fixed K=2's outcomes (common random
    numbers between the modes a bench compares)."""
    rng = np.random.default_rng(5)
    reference = {2: rng.integers(0, V, 60)}
    short = _synthetic(reference, acceptance_rate=0.5, seed=4)
    long = _synthetic(reference, acceptance_rate=0.5, seed=4)
    short.add_request(0, _request(2, [1]))
    long.add_request(0, _request(2, [1]))
    for g in range(1, 50):
        tokens = [1] + reference[2][:g].tolist()
        drafted_2 = short.propose([_input(tokens, 1, 2, slot=0, index=2)])[0].tokens
        if g % 3:  # the other proposer is not asked at every position (a policy skipping it)
            drafted_7 = long.propose([_input(tokens, 1, 7, slot=0, index=2)])[0].tokens
            assert drafted_7[:2].tolist() == drafted_2.tolist()
    # and the draws are not the same at every position: the right/wrong pattern varies
    full = long.propose([_input([1] + reference[2][:1].tolist(), 1, 40, slot=0, index=2)])[0].tokens
    right = full == reference[2][1:41]
    assert 0 < right.sum() < len(right)


# ---------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    name=st.sampled_from(["prompt_lookup", "suffix", "synthetic"]),
)
def test_proposers_never_exceed_k_max_nor_the_vocabulary(data, name):
    prompt = data.draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=30))
    steps = data.draw(st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(0, V - 1), min_size=1, max_size=4)), max_size=8))
    reference = {0: np.asarray(data.draw(st.lists(st.integers(0, V - 1), min_size=0, max_size=30)), dtype=np.int64)}
    proposer = {
        "prompt_lookup": lambda: PromptLookupProposer(PromptLookupConfig()),
        "suffix": lambda: SuffixProposer(SuffixConfig(max_spec_factor=3.0, min_token_prob=0.0)),
        "synthetic": lambda: _synthetic(reference, acceptance_rate=0.5),
    }[name]()
    proposer.add_request(0, _request(0, prompt))
    tokens = list(prompt)
    for k_max, appended in steps:
        proposal = proposer.propose([_input(tokens, len(prompt), k_max)])[0]
        assert len(proposal.tokens) <= k_max
        assert proposal.tokens.dtype == np.int64
        assert ((proposal.tokens >= 0) & (proposal.tokens < V)).all()
        proposer.on_accepted(0, np.asarray(appended))
        tokens += appended
    proposer.remove_request(0)


# ---------------------------------------------------------------------------- draft_model


def _prefix_state(prefix) -> int:
    """A rolling hash of a whole prefix: the fake model's 'hidden state'."""
    h = 17
    for token in prefix:
        h = (h * 1_000_003 + int(token) + 1) % 2_147_483_647
    return h


_TABLE = np.random.default_rng(5).normal(size=(97, V)).astype(np.float32)


def _fake_logits(prefix) -> np.ndarray:
    return _TABLE[_prefix_state(prefix) % 97]


def _oracle_greedy(context, k) -> list[int]:
    """What a correct draft proposes: greedy tokens from the true context."""
    context, out = list(context), []
    for _ in range(k):
        out.append(int(np.argmax(_fake_logits(context))))
        context.append(out[-1])
    return out


class FakeDraftSession:
    """The Session contract in numpy: a KV row per slot holding the token at each position;
    writes at position_ids (-1 writes slot ctx_len-1 without continuous batching, nothing
    with it), reads masked to slots <= the query position, logits rows ending at the last
    valid position. The next-token logits hash the whole cached prefix, so stale KV or a
    skipped catch-up token changes them."""

    def __init__(self, rows=4, ctx_len=64, prefill_seq_len=8, continuous_batching=True, seq2=True):
        self.kv_batch_size, self.ctx_len, self.vocab_size = rows, ctx_len, V
        self.cb = continuous_batching
        fbs = rows if continuous_batching else None
        self.specializations = [Specialization("prefill", 1 if continuous_batching else rows, prefill_seq_len, ctx_len, 1, fbs)]
        for k in (0, 1) if seq2 else (0,):
            self.specializations.append(Specialization("decode", rows, k + 1, ctx_len, k + 1, fbs, k))
        self.kv = np.full((rows, ctx_len), -7, dtype=np.int64)
        self.calls: list[tuple[int, int]] = []
        self.closed = False

    def run(self, input_ids, position_ids, num_logits_to_keep, batch_index=None):
        b, s = input_ids.shape
        assert (b, s, num_logits_to_keep) in {(x.batch_size, x.seq_len, x.num_logits_to_keep) for x in self.specializations}
        assert input_ids.dtype == np.int64 and position_ids.dtype == np.int64
        assert (input_ids >= 0).all() and (input_ids < V).all(), "token ids must be valid, never -1"
        assert (batch_index is not None) == self.cb
        assert position_ids.max() < self.ctx_len - 1, "position reaches the trash slot"
        self.calls.append((b, s))
        rows = batch_index[:, 0] if self.cb else np.arange(b)
        for i in range(b):
            for j in range(s):
                if position_ids[i, j] >= 0:
                    self.kv[rows[i], position_ids[i, j]] = input_ids[i, j]
                elif not self.cb:
                    self.kv[rows[i], -1] = input_ids[i, j]
        logits = np.full((b, num_logits_to_keep, V), np.nan, dtype=np.float32)
        for i in range(b):
            last = int(np.argmax(position_ids[i]))
            for c in range(num_logits_to_keep):
                col = max(last + 1 - num_logits_to_keep, 0) + c
                q = position_ids[i, min(col, s - 1)]
                if q >= 0:
                    logits[i, c] = _fake_logits(self.kv[rows[i], : q + 1])
        return logits

    def close(self):
        self.closed = True


def _draft_proposer(session, **config):
    draft_info = _info("draft", tokenizer=None)
    ctx = _ctx(build_session=lambda **kw: (session, draft_info))
    return make_draft_model(DraftModelConfig(model="fake-draft", **config), ctx)


def _target_next(context) -> int:
    """The fake target: agrees with the draft's greedy token ~70% of the time."""
    greedy = _oracle_greedy(context, 1)[0]
    return greedy if _prefix_state(context) % 10 < 7 else (greedy + 1) % V


def _drive(proposer, session, requests, steps, rng, k_choices=(0, 1, 2, 3, 4)):
    """A tiny generation loop: check every proposal against the oracle, accept like greedy."""
    contexts = {}
    for slot, prompt in requests.items():
        proposer.add_request(slot, _request(slot, prompt))
        contexts[slot] = list(prompt) + [_target_next(prompt)]  # the prefill's token
        proposer.on_accepted(slot, np.asarray(contexts[slot][-1:]))
    bonus_steps = 0
    for _ in range(steps):
        slots = sorted(contexts)
        ks = {s: int(rng.choice(k_choices)) for s in slots}
        inputs = [_input(contexts[s], len(requests[s]), ks[s], slot=s, index=s) for s in slots]
        proposals = proposer.propose(inputs)
        for s, proposal in zip(slots, proposals):
            expected = _oracle_greedy(contexts[s], ks[s])
            assert proposal.tokens.tolist() == expected, f"slot {s}: drafts from a stale cache"
            appended = []
            for token in proposal.tokens.tolist():
                if token != _target_next(contexts[s] + appended):
                    break
                appended.append(token)
            bonus_steps += len(appended) == len(proposal.tokens) > 0
            appended.append(_target_next(contexts[s] + appended))
            contexts[s] += appended
            proposer.on_accepted(s, np.asarray(appended))
    return contexts, bonus_steps


@pytest.mark.parametrize("continuous_batching", [True, False], ids=["cb", "static"])
@pytest.mark.parametrize("seq2", [True, False], ids=["seq2", "seq1-only"])
def test_draft_model_catches_up_and_drafts_what_the_draft_model_predicts(continuous_batching, seq2):
    session = FakeDraftSession(rows=3, ctx_len=96, prefill_seq_len=8, continuous_batching=continuous_batching, seq2=seq2)
    proposer = _draft_proposer(session)
    rng = np.random.default_rng(0)
    requests = {0: rng.integers(0, V, 13).tolist(), 1: rng.integers(0, V, 5).tolist(), 2: rng.integers(0, V, 21).tolist()}
    _, bonus_steps = _drive(proposer, session, requests, steps=12, rng=rng)
    assert bonus_steps > 0, "the test never exercised the all-accepted (bonus) catch-up"
    if seq2:
        assert proposer.run_counts.get("decode2", 0) > 0
    else:
        assert "decode2" not in proposer.run_counts
    proposer.close()
    assert session.closed


def test_draft_model_serves_slots_that_join_and_leave():
    session = FakeDraftSession(rows=2, ctx_len=128, prefill_seq_len=4)
    proposer = _draft_proposer(session)
    rng = np.random.default_rng(1)
    _drive(proposer, session, {0: [3, 4, 5, 6, 7], 1: [9, 9]}, steps=4, rng=rng)
    proposer.remove_request(1)
    # a new request takes slot 1, whose cache row still holds the old request's KV
    _drive(proposer, session, {1: [8, 7, 6, 5, 4, 3, 2, 1, 0]}, steps=6, rng=rng)


def test_draft_model_batches_prefill_and_drafting_across_requests():
    session = FakeDraftSession(rows=4, ctx_len=64, prefill_seq_len=8, continuous_batching=False)
    proposer = _draft_proposer(session)
    for slot in range(4):
        proposer.add_request(slot, _request(slot, list(range(slot, slot + 10))))
    inputs = [_input(list(range(s, s + 10)) + [1], 10, 3, slot=s) for s in range(4)]
    proposer.propose(inputs)
    # 10 prompt tokens in chunks of 8: 2 prefill runs for all four rows, 1 catch-up, 2 drafts
    assert proposer.run_counts == {"prefill": 2, "decode1": 3}


def test_draft_model_caps_drafts_at_num_speculative_tokens_and_the_context():
    session = FakeDraftSession(rows=1, ctx_len=24, prefill_seq_len=8)
    proposer = _draft_proposer(session, num_speculative_tokens=2)
    proposer.add_request(0, _request(0, [1, 2, 3]))
    assert len(proposer.propose([_input([1, 2, 3, 4], 3, 5)])[0].tokens) == 2
    long = list(range(22))
    proposer.add_request(0, _request(0, long[:20]))
    assert len(proposer.propose([_input(long, 20, 5)])[0].tokens) == 2  # positions stay < ctx_len-1


def test_draft_model_sampling_returns_draft_distributions():
    session = FakeDraftSession(rows=1)
    ctx = _ctx(sampling=Sampling(temperature=0.8, top_k=5), build_session=lambda **kw: (session, _info("draft")))
    proposer = make_draft_model(DraftModelConfig(model="d", sampling="sample"), ctx)
    proposer.add_request(0, _request(0, [1, 2, 3], seed=4))
    proposal = proposer.propose([_input([1, 2, 3, 4], 3, 3)])[0]
    assert proposal.probs is not None and proposal.probs.shape == (3, V) and proposal.probs.dtype == np.float32
    assert np.allclose(proposal.probs.sum(1), 1.0, atol=1e-5)
    assert ((proposal.probs > 0).sum(1) <= 5).all()
    assert all(proposal.probs[i, t] > 0 for i, t in enumerate(proposal.tokens))


def test_draft_model_build_session_gets_the_draft_settings():
    seen = {}

    def build_session(**kwargs):
        seen.update(kwargs)
        return FakeDraftSession(rows=1), _info("draft")

    make_draft_model(DraftModelConfig(model="spdflow:tinycode-draft", device_ids=[1], num_cores=4), _ctx(build_session=build_session))
    assert seen == {"model_id": "spdflow:tinycode-draft", "k_list": [0, 1], "role": "draft", "device_ids": [1], "num_cores": 4}


def test_draft_model_rejects_a_draft_with_another_vocabulary():
    session = FakeDraftSession(rows=1)
    ctx = _ctx(build_session=lambda **kw: (session, _info("draft", vocab=1000)))
    with pytest.raises(RecipeError, match="draft model 'small' has vocab 1000 but target 'target' has 50"):
        make_draft_model(DraftModelConfig(model="small"), ctx)
    assert session.closed


def test_draft_model_rejects_a_draft_with_another_tokenizer(tmp_path):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text('{"model": {"vocab": {"x": 0, "y": 1}}, "added_tokens": []}')
    b.write_text('{"model": {"vocab": {"y": 1, "x": 0}},\n "added_tokens": [], "normalizer": null}')
    c.write_text('{"model": {"vocab": {"x": 1, "y": 0}}, "added_tokens": []}')
    target = _info("target", tokenizer=a)
    ok = _ctx(target=target, build_session=lambda **kw: (FakeDraftSession(rows=1), _info("draft", tokenizer=b)))
    make_draft_model(DraftModelConfig(model="same-family"), ok)
    bad = _ctx(target=target, build_session=lambda **kw: (FakeDraftSession(rows=1), _info("draft", tokenizer=c)))
    with pytest.raises(RecipeError, match="different tokenizers"):
        make_draft_model(DraftModelConfig(model="other-family"), bad)


def test_draft_model_reuses_the_kv_of_accepted_drafts():
    session = FakeDraftSession(rows=1, ctx_len=64, prefill_seq_len=8)
    proposer = _draft_proposer(session)
    context = [1, 2, 3, 4, 5]
    proposer.add_request(0, _request(0, context))
    context += [6]  # the prefill's token
    drafts = proposer.propose([_input(context, 5, 3)])[0].tokens.tolist()
    # every draft accepted + a bonus: one seq-2 catch-up (last draft + bonus), two more drafts
    proposer.run_counts.clear()
    context += drafts + [7]
    drafts = proposer.propose([_input(context, 5, 3)])[0].tokens.tolist()
    assert proposer.run_counts == {"decode2": 1, "decode1": 2}
    # first draft accepted, then a correction: one seq-1 catch-up
    proposer.run_counts.clear()
    context += drafts[:1] + [(drafts[1] + 1) % V]
    assert proposer.propose([_input(context, 5, 3)])[0].tokens.tolist() == _oracle_greedy(context, 3)
    assert proposer.run_counts == {"decode1": 3}
