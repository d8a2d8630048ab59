"""Acceptance methods: greedy tables, and a chi-squared test that rejection sampling emits
exactly the target's sampling distribution (DESIGN §6 "lossless")."""
from __future__ import annotations

import math

import numpy as np
import pytest

from spdflow.api import AcceptRow, Proposal, Sampling
from spdflow_decoding import GreedyAcceptor, RejectionAcceptor, target_distribution
from spdflow_decoding.acceptance import sample_from

V = 6


def _rows(proposals, probs=None, seed=0):
    rng = np.random.default_rng(seed)
    probs = probs or [None] * len(proposals)
    return [
        AcceptRow(slot=i, proposal=Proposal(np.asarray(p, dtype=np.int64), q), rng=rng)
        for i, (p, q) in enumerate(zip(proposals, probs))
    ]


def _logits_with_argmax(argmaxes):
    """[B, K+1, V] logits whose argmax at [b, j] is argmaxes[b][j]."""
    a = np.asarray(argmaxes)
    logits = np.zeros(a.shape + (V,), dtype=np.float32)
    np.put_along_axis(logits, a[..., None], 5.0, axis=-1)
    return logits


# ------------------------------------------------------------------------------------ greedy


@pytest.mark.parametrize(
    "target, proposal, expected",
    [
        ([1, 2, 3, 4], [1, 2, 3], [1, 2, 3, 4]),  # all accepted + bonus
        ([1, 2, 3, 4], [1, 5, 3], [1, 2]),  # mismatch at 1: correction 2
        ([1, 2, 3, 4], [0, 2, 3], [1]),  # first rejected
        ([1, 2, 3, 4], [], [1]),  # nothing proposed: the target's token
        ([1, 2, 3, 4], [1, 2], [1, 2, 3]),  # short proposal in a K=3 batch: bonus at 2
        ([4, 4, 4, 4], [4, 4, 4], [4, 4, 4, 4]),
    ],
)
def test_greedy_accepts_the_matching_prefix_plus_one_target_token(target, proposal, expected):
    logits = _logits_with_argmax([target])
    out = GreedyAcceptor().accept(logits, _rows([proposal]), Sampling())
    assert out[0].tolist() == expected
    assert out[0].dtype == np.int64


def test_greedy_handles_a_batch_with_different_proposal_lengths():
    logits = _logits_with_argmax([[1, 2, 3], [0, 0, 0], [5, 4, 3]])
    out = GreedyAcceptor().accept(logits, _rows([[1, 2], [], [5, 0]]), Sampling())
    assert [o.tolist() for o in out] == [[1, 2, 3], [0], [5, 4]]


def test_greedy_at_k0_emits_the_argmax():
    logits = _logits_with_argmax([[3], [2]])
    out = GreedyAcceptor().accept(logits, _rows([[], []]), Sampling())
    assert [o.tolist() for o in out] == [[3], [2]]


@pytest.mark.parametrize("acceptor", [GreedyAcceptor(), RejectionAcceptor()], ids=["greedy", "rejection"])
def test_acceptors_handle_an_empty_batch(acceptor):
    logits = np.zeros((0, 3, V), dtype=np.float32)
    assert acceptor.accept(logits, [], Sampling(temperature=1.0)) == []


def test_rejection_at_temperature_zero_is_greedy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 4, V)).astype(np.float32)
    proposals = [rng.integers(0, V, size=n).tolist() for n in (3, 2, 0, 3)]
    proposals[0] = logits[0].argmax(-1)[:3].tolist()  # one fully accepted row
    greedy = GreedyAcceptor().accept(logits, _rows(proposals), Sampling())
    rejection = RejectionAcceptor().accept(logits, _rows(proposals), Sampling(temperature=0.0))
    assert [g.tolist() for g in greedy] == [r.tolist() for r in rejection]
    assert len(greedy[0]) == 4


# ------------------------------------------------------------------------ target distribution


def test_target_distribution_applies_temperature_top_k_and_top_p():
    logits = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05, 0.0 + 1e-300]))
    p = target_distribution(logits, Sampling(temperature=1.0))
    assert p.dtype == np.float64 and np.allclose(p, [0.4, 0.3, 0.15, 0.1, 0.05, 0.0])
    assert np.allclose(target_distribution(logits, Sampling(1.0, top_k=2)), [4 / 7, 3 / 7, 0, 0, 0, 0])
    # top_p 0.8: 0.4 + 0.3 = 0.7 < 0.8, so 0.15 joins; the rest is dropped.
    assert np.allclose(target_distribution(logits, Sampling(1.0, top_p=0.8)), np.array([0.4, 0.3, 0.15, 0, 0, 0]) / 0.85)
    # a tiny top_p keeps the most likely token only
    assert np.allclose(target_distribution(logits, Sampling(1.0, top_p=0.01)), [1, 0, 0, 0, 0, 0])
    hot = target_distribution(logits, Sampling(temperature=2.0))
    assert np.allclose(hot, np.sqrt([0.4, 0.3, 0.15, 0.1, 0.05, 0.0]) / np.sqrt([0.4, 0.3, 0.15, 0.1, 0.05]).sum())


def test_target_distribution_works_on_batches():
    logits = np.random.default_rng(0).normal(size=(3, 2, V))
    batched = target_distribution(logits, Sampling(0.7, top_k=3, top_p=0.9))
    single = target_distribution(logits[1, 1], Sampling(0.7, top_k=3, top_p=0.9))
    assert np.allclose(batched[1, 1], single)
    assert np.allclose(batched.sum(-1), 1.0)


def test_sample_from_never_returns_a_zero_probability_token():
    class AlmostOne:
        def random(self):
            return 1.0 - 1e-17

    assert sample_from(np.array([0.5, 0.5, 0.0]), AlmostOne()) == 1


# ---------------------------------------------------------------------------- chi-squared


def chi2_pvalue(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """p-value of Pearson's chi-squared goodness of fit. Cells the target gives probability 0
    must be empty (returns 0.0 otherwise); scipy when installed, else Wilson-Hilferty."""
    observed = observed.ravel().astype(np.float64)
    expected_probs = expected_probs.ravel()
    if observed[expected_probs <= 0].sum() > 0:
        return 0.0
    keep = expected_probs > 0
    expected = expected_probs[keep] * observed.sum()
    stat = float(((observed[keep] - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    try:
        from scipy.stats import chi2

        return float(chi2.sf(stat, df))
    except ImportError:  # pragma: no cover - numpy-only fallback
        z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
        return 0.5 * math.erfc(z / math.sqrt(2))


# A tiny "model": the target's logits after token t are TARGET[t], the draft's are DRAFT[t],
# so the distribution of a generated sequence is known exactly.
_tables = np.random.default_rng(1234)
TARGET = _tables.normal(scale=1.5, size=(V, V))
DRAFT = TARGET + _tables.normal(scale=1.5, size=(V, V))  # related but different
ANCHOR = 2
N = 6000


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _draft_tokens(prev, k, rng):
    """k draft tokens per row from softmax(DRAFT[prev]) chains, with their distributions."""
    tokens = np.zeros((len(prev), k), dtype=np.int64)
    qs = np.zeros((len(prev), k, V))
    for j in range(k):
        q = _softmax(DRAFT[prev])
        u = rng.random(len(prev))[:, None]
        prev = np.minimum((np.cumsum(q, axis=1) < u).sum(1), V - 1)
        tokens[:, j], qs[:, j] = prev, q
    return tokens, qs


def _generate_two(acceptor, sampling, *, with_probs, k=3, seed=7):
    """The first two tokens each of N independent requests emits, as an [N, 2] array.

    Proposal lengths vary from 0 to k within a batch, so the first two tokens include
    corrections, accepted drafts and bonus tokens."""
    rng = np.random.default_rng(seed)
    out = [[] for _ in range(N)]
    last = np.full(N, ANCHOR)
    todo = np.arange(N)
    while len(todo):
        drafts, qs = _draft_tokens(last[todo], k, rng)
        logits = TARGET[np.concatenate([last[todo, None], drafts], axis=1)].astype(np.float32)
        lengths = rng.integers(0, k + 1, size=len(todo))
        rows = [
            AcceptRow(int(i), Proposal(drafts[r, :n], qs[r, :n].astype(np.float32) if with_probs else None), rng)
            for r, (i, n) in enumerate(zip(todo, lengths))
        ]
        for i, tokens in zip(todo, acceptor.accept(logits, rows, sampling)):
            assert 1 <= len(tokens) <= k + 1 and tokens.dtype == np.int64
            out[i].extend(tokens.tolist())
            last[i] = out[i][-1]
        todo = np.array([i for i in todo if len(out[i]) < 2], dtype=np.int64)
    return np.array([o[:2] for o in out])


def _expected(sampling):
    """Exact joint distribution of the first two tokens sampled from the target: [V, V]."""
    p = target_distribution(TARGET, sampling)
    return p[ANCHOR][:, None] * p


def _pvalues(samples, sampling):
    joint = np.zeros((V, V))
    np.add.at(joint, (samples[:, 0], samples[:, 1]), 1)
    expected = _expected(sampling)
    return chi2_pvalue(joint.sum(1), expected.sum(1)), chi2_pvalue(joint, expected)


SAMPLINGS = [
    Sampling(temperature=1.0),
    Sampling(temperature=0.7, top_k=3),
    Sampling(temperature=1.3, top_p=0.8),
    Sampling(temperature=1.0, top_k=4, top_p=0.9),
]


@pytest.mark.parametrize("with_probs", [True, False], ids=["draft-probs", "point-mass"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}")
def test_rejection_sampling_reproduces_the_target_distribution(sampling, with_probs):
    samples = _generate_two(RejectionAcceptor(), sampling, with_probs=with_probs)
    first, pair = _pvalues(samples, sampling)
    assert first > 1e-3, f"first token distribution differs from the target (p={first:.2g})"
    assert pair > 1e-3, f"two-token distribution differs from the target (p={pair:.2g})"


class AlwaysAccept:
    """A deliberately wrong acceptor: keeps every proposal, then samples a bonus token."""

    def accept(self, logits, rows, sampling):
        out = []
        for i, row in enumerate(rows):
            n = len(row.proposal.tokens)
            bonus = sample_from(target_distribution(logits[i, n], sampling), row.rng)
            out.append(np.append(row.proposal.tokens, bonus).astype(np.int64))
        return out


class IgnoresDraftProbs:
    """A subtler wrong acceptor: treats sampled drafts as point masses only when probs exist."""

    def accept(self, logits, rows, sampling):
        for row in rows:
            row.proposal = Proposal(row.proposal.tokens, None if row.proposal.probs is None else row.proposal.probs * 0 + 1.0 / V)
        return RejectionAcceptor().accept(logits, rows, sampling)


class BonusFromWrongRow:
    """An off-by-one bug: the bonus token is drawn from the last proposal's row, not after it."""

    def accept(self, logits, rows, sampling):
        out = RejectionAcceptor().accept(logits, rows, sampling)
        for i, (row, tokens) in enumerate(zip(rows, out)):
            n = len(row.proposal.tokens)
            if n and len(tokens) == n + 1:
                tokens[-1] = sample_from(target_distribution(logits[i, n - 1], sampling), row.rng)
        return out


@pytest.mark.parametrize(
    "acceptor",
    [AlwaysAccept(), IgnoresDraftProbs(), BonusFromWrongRow()],
    ids=["always-accept", "wrong-q", "bonus-off-by-one"],
)
def test_the_chi_squared_test_catches_a_wrong_acceptor(acceptor):
    sampling = SAMPLINGS[0]
    samples = _generate_two(acceptor, sampling, with_probs=True)
    first, pair = _pvalues(samples, sampling)
    assert min(first, pair) < 1e-6


def test_rejection_is_reproducible_from_the_row_generators():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(3, 4, V)).astype(np.float32)
    proposals = [rng.integers(0, V, 3) for _ in range(3)]

    def run():
        rows = [AcceptRow(i, Proposal(p), np.random.default_rng(100 + i)) for i, p in enumerate(proposals)]
        return [o.tolist() for o in RejectionAcceptor().accept(logits, rows, Sampling(1.0))]

    assert run() == run()


def test_rejection_never_accepts_a_token_the_target_excludes():
    logits = np.zeros((1, 3, V), dtype=np.float32)
    logits[0, :, 0] = 10.0  # top_k=1 leaves only token 0 possible
    rows = _rows([[3, 3]])
    out = RejectionAcceptor().accept(logits, rows, Sampling(1.0, top_k=1))
    assert out[0].tolist() == [0]
