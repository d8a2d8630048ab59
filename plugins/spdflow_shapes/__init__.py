"""Built-in specialize stage: a K-list and shape settings -> the compiled shapes (DESIGN §4).

The same pure function serves the target and a draft model (each with its own K-list), lint
(shape coverage) and ``run --dry-run``.
"""
from __future__ import annotations

from typing import Iterable

from spdflow.api import Specialization
from spdflow.hookspecs import hookimpl


def normalize_k_list(num_speculative_tokens: int | Iterable[int]) -> list[int]:
    """An int K means [K]; a list is sorted and deduplicated (QEfficient's ``_decode_ks``)."""
    if isinstance(num_speculative_tokens, bool):
        raise ValueError("num_speculative_tokens must be an int or a list of ints, got a bool")
    if isinstance(num_speculative_tokens, int):
        ks = [num_speculative_tokens]
    else:
        ks = list(num_speculative_tokens)
    if not ks:
        raise ValueError("the K-list is empty; give at least one K, e.g. [0, 4]")
    if any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in ks):
        raise ValueError(f"every K must be a non-negative int, got {ks}")
    return sorted(set(ks))


def _check_shapes(ks: list[int], prefill_seq_len: int, ctx_len: int, batch_size: int,
                  full_batch_size: int | None) -> None:
    if batch_size < 1 or (full_batch_size is not None and full_batch_size < 1):
        raise ValueError("batch_size and full_batch_size must be at least 1")
    if prefill_seq_len < max(ks) + 1:
        raise ValueError(
            f"prefill_seq_len {prefill_seq_len} is shorter than the largest K + 1 ({max(ks) + 1}); "
            "raise specialization.prefill_seq_len or lower num_speculative_tokens"
        )
    if ctx_len <= prefill_seq_len:
        raise ValueError(
            f"ctx_len {ctx_len} must be larger than prefill_seq_len {prefill_seq_len}; "
            "raise specialization.ctx_len"
        )


def specialize(
    num_speculative_tokens: int | Iterable[int],
    prefill_seq_len: int,
    ctx_len: int,
    batch_size: int,
    full_batch_size: int | None,
) -> list[Specialization]:
    """Prefill first, then one decode shape per distinct K ascending (seq_len = nlk = K+1).

    Under continuous batching (``full_batch_size`` set) prefill runs at batch 1 and decode at
    ``full_batch_size``, both carrying the ``full_batch_size`` symbol. Shapes are deduplicated
    on the full symbol tuple, so K+1 == prefill_seq_len keeps the decode shape (nlk K+1) next to
    the prefill (nlk 1), unlike QEfficient which compares seq_len only.

    :raises ValueError: prefill_seq_len < max(K)+1, or ctx_len <= prefill_seq_len.
    """
    ks = normalize_k_list(num_speculative_tokens)
    _check_shapes(ks, prefill_seq_len, ctx_len, batch_size, full_batch_size)
    cb = full_batch_size is not None
    specs = [
        Specialization(
            kind="prefill",
            batch_size=1 if cb else batch_size,
            seq_len=prefill_seq_len,
            ctx_len=ctx_len,
            num_logits_to_keep=1,
            full_batch_size=full_batch_size,
        )
    ]
    for k in ks:
        specs.append(
            Specialization(
                kind="decode",
                batch_size=full_batch_size if cb else batch_size,
                seq_len=k + 1,
                ctx_len=ctx_len,
                num_logits_to_keep=k + 1,
                full_batch_size=full_batch_size,
                k=k,
            )
        )
    return _dedupe(specs)


def _dedupe(specs: list[Specialization]) -> list[Specialization]:
    # Two shapes are the same compiled graph only if every symbol matches.
    seen: set[tuple] = set()
    unique = []
    for spec in specs:
        key = tuple(spec.symbols().items())
        if key not in seen:
            seen.add(key)
            unique.append(spec)
    return unique


@hookimpl(trylast=True)
def spdflow_specialize(
    num_speculative_tokens, prefill_seq_len, ctx_len, batch_size, full_batch_size
) -> list[Specialization]:
    """Default specialize stage: :func:`specialize`."""
    return specialize(num_speculative_tokens, prefill_seq_len, ctx_len, batch_size, full_batch_size)
