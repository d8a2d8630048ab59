"""Acceptance methods: target logits + proposals -> the tokens each request appends.

* ``greedy`` — the longest prefix of the proposal that equals the target's argmax, then the
  target's argmax after it (the correction at the first mismatch, or the bonus token after the
  last proposal). Vectorised over the batch: it runs every decode step.
* ``rejection`` — lossless speculative sampling (Leviathan et al. 2023, Chen et al. 2023).
  Proposal i with draft distribution q is kept with probability min(1, p(d)/q(d)); at the first
  rejection one token is drawn from norm(max(p - q, 0)); when all are kept, a bonus token is drawn
  from p after the last proposal. A proposal without ``probs`` is a point-mass draft
  (q = one-hot(d)): kept with probability p(d), else a token from p with d removed. p is the
  target distribution after temperature, top-k and top-p (:func:`target_distribution`), so the
  emitted sequence follows exactly the distribution plain sampling from the target would give.
  At temperature 0 it is ``greedy``. Randomness comes only from ``AcceptRow.rng``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from spdflow.api import AcceptRow, Acceptor, Sampling


def target_distribution(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """The distribution sampling draws from: softmax(logits / T) restricted by top-k and top-p.

    Works on the last axis of ``logits`` (any leading shape) and returns float64 probabilities
    of the same shape. top-k keeps every token tied with the k-th largest logit (as HF's
    TopKLogitsWarper); top-p keeps the smallest set of most likely tokens whose mass reaches
    ``top_p`` (the most likely token always stays). ``temperature`` must be > 0.
    """
    if sampling.temperature <= 0:
        raise ValueError("target_distribution needs temperature > 0; temperature 0 is greedy")
    x = np.asarray(logits, dtype=np.float64) / float(sampling.temperature)
    vocab = x.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = np.partition(x, vocab - sampling.top_k, axis=-1)[..., vocab - sampling.top_k, None]
        x = np.where(x < kth, -np.inf, x)
    probs = _softmax(x)
    if sampling.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        ranked = np.take_along_axis(probs, order, axis=-1)
        # A token is dropped when the more likely tokens before it already reach top_p.
        mass_before = np.cumsum(ranked, axis=-1) - ranked
        drop_ranked = mass_before >= sampling.top_p
        drop = np.empty_like(drop_ranked)
        np.put_along_axis(drop, order, drop_ranked, axis=-1)
        probs = _softmax(np.where(drop, -np.inf, x))
    return probs


def _softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def sample_from(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token id drawn from ``probs`` (need not be normalised) with one uniform of ``rng``.

    Inverse-CDF sampling: one ``rng.random()`` per draw keeps the stream of draws per request
    easy to reason about, and never returns a zero-probability token.
    """
    cdf = np.cumsum(probs)
    index = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    if index >= len(cdf) or probs[index] <= 0:  # u * total rounded up to total
        index = int(np.flatnonzero(probs > 0)[-1])
    return index


def _proposal_matrix(rows: Sequence[AcceptRow], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Proposals as a [B, k] int64 matrix padded with -1 (never an argmax) and their lengths."""
    batch = len(rows)
    tokens = np.full((batch, k), -1, dtype=np.int64)
    lengths = np.zeros(batch, dtype=np.int64)
    for i, row in enumerate(rows):
        proposed = np.asarray(row.proposal.tokens, dtype=np.int64)[:k]
        tokens[i, : len(proposed)] = proposed
        lengths[i] = len(proposed)
    return tokens, lengths


def accept_greedy(logits: np.ndarray, rows: Sequence[AcceptRow]) -> list[np.ndarray]:
    """Greedy acceptance for the whole batch (see the module docstring)."""
    k = logits.shape[1] - 1
    target = np.argmax(logits, axis=-1)  # [B, K+1]
    proposals, _ = _proposal_matrix(rows, k)
    # Padding is -1, so a row's matches stop at its own length without a separate mask.
    matches = np.cumprod(proposals == target[:, :k], axis=1).sum(axis=1)
    # Accepted proposals equal the target's argmax, so the output is a prefix of ``target``.
    return [target[i, : matches[i] + 1].astype(np.int64) for i in range(len(rows))]


def _accept_row_sampled(
    probs: np.ndarray, proposal_tokens: np.ndarray, draft_probs: np.ndarray | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """Speculative sampling of one row; ``probs`` is the target distribution [n+1, V]."""
    out: list[int] = []
    for j, token in enumerate(int(t) for t in proposal_tokens):
        p = probs[j]
        if draft_probs is None:
            q_token = 1.0
        else:
            q = np.asarray(draft_probs[j], dtype=np.float64)
            q = q / q.sum()
            q_token = q[token]
        # q(d) = 0 cannot be drawn by an honest draft; keep it iff the target allows it.
        keep = p[token] > 0 if q_token <= 0 else rng.random() < min(1.0, p[token] / q_token)
        if keep:
            out.append(token)
            continue
        if draft_probs is None:
            residual = p.copy()
            residual[token] = 0.0
        else:
            residual = np.maximum(p - q, 0.0)
        if residual.sum() <= 0:  # only by round-off: p == q
            residual = p
        out.append(sample_from(residual, rng))
        return np.asarray(out, dtype=np.int64)
    out.append(sample_from(probs[len(out)], rng))
    return np.asarray(out, dtype=np.int64)


def accept_rejection(
    logits: np.ndarray, rows: Sequence[AcceptRow], sampling: Sampling
) -> list[np.ndarray]:
    """Rejection-sampling acceptance for the whole batch (see the module docstring)."""
    if sampling.temperature <= 0:
        return accept_greedy(logits, rows)
    k = logits.shape[1] - 1
    proposals = [np.asarray(row.proposal.tokens, dtype=np.int64)[:k] for row in rows]
    # One vectorised target_distribution over only the logits rows that can be read: row i
    # needs its n_i + 1 positions, not all K + 1 (large vocabularies make the rest costly).
    batch_ids = np.concatenate([np.full(len(t) + 1, i) for i, t in enumerate(proposals)] or [[]]).astype(np.int64)
    positions = np.concatenate([np.arange(len(t) + 1) for t in proposals] or [[]]).astype(np.int64)
    probs = target_distribution(logits[batch_ids, positions], sampling)
    results, offset = [], 0
    for row, tokens in zip(rows, proposals):
        n = len(tokens)
        draft = row.proposal.probs
        draft = None if draft is None else draft[:n]
        results.append(_accept_row_sampled(probs[offset : offset + n + 1], tokens, draft, row.rng))
        offset += n + 1
    return results


class GreedyAcceptor(Acceptor):
    """Accept the proposal prefix that matches the target's argmax, plus one target token."""

    name = "greedy"
    lossless_at = "zero"

    def accept(self, logits, rows, sampling):
        return accept_greedy(logits, rows)


class RejectionAcceptor(Acceptor):
    """Lossless speculative sampling; greedy at temperature 0."""

    name = "rejection"
    lossless_at = "any"

    def accept(self, logits, rows, sampling):
        return accept_rejection(logits, rows, sampling)
