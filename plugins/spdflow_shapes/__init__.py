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


def ccl_lists(
    comp_ctx_lengths: Iterable[int] | None,
    comp_ctx_lengths_prefill: Iterable[int] | None,
    ctx_len: int,
    prefill_seq_len: int,
) -> tuple[list[int], list[int]] | None:
    """The (prefill, decode) compute context lengths, or None when CCL is off (neither given).

    Each list is sorted and deduplicated and ends with ctx_len (added when absent), so every
    sequence the cache holds has a CCL. ``comp_ctx_lengths`` serves decode and, unless
    ``comp_ctx_lengths_prefill`` is given, prefill too, without the values below
    prefill_seq_len (a prefill chunk reads at least prefill_seq_len slots).

    :raises ValueError: a CCL below 1 or above ctx_len, or an explicit prefill CCL below
        prefill_seq_len (lint reports these as SPD121 and SPD123 first).
    """
    if comp_ctx_lengths is None and comp_ctx_lengths_prefill is None:
        return None

    def clean(values: Iterable[int], what: str, low: int) -> list[int]:
        values = sorted(set(int(v) for v in values))
        bad = [v for v in values if v < low or v > ctx_len]
        if bad:
            raise ValueError(f"{what} {bad} must lie between {low} and ctx_len {ctx_len}")
        return values if values and values[-1] == ctx_len else values + [ctx_len]

    decode = clean(comp_ctx_lengths or [], "compute context lengths", 1)
    if comp_ctx_lengths_prefill is not None:
        prefill = clean(comp_ctx_lengths_prefill, "prefill compute context lengths", prefill_seq_len)
    else:
        prefill = [c for c in decode if c >= prefill_seq_len]
    return prefill, decode


def specialize(
    num_speculative_tokens: int | Iterable[int],
    prefill_seq_len: int,
    ctx_len: int,
    batch_size: int,
    full_batch_size: int | None,
    comp_ctx_lengths: Iterable[int] | None = None,
    comp_ctx_lengths_prefill: Iterable[int] | None = None,
) -> list[Specialization]:
    """Prefill first, then one decode shape per distinct K ascending (seq_len = nlk = K+1).

    With compute context lengths (:func:`ccl_lists`) every shape exists once per CCL: the
    prefill × the prefill CCLs, then each K × the decode CCLs, CCL ascending within a K.

    Under continuous batching (``full_batch_size`` set) prefill runs at batch 1 and decode at
    ``full_batch_size``, both carrying the ``full_batch_size`` symbol. Shapes are deduplicated
    on the full symbol tuple, so K+1 == prefill_seq_len keeps the decode shape (nlk K+1) next to
    the prefill (nlk 1), unlike QEfficient which compares seq_len only.

    :raises ValueError: prefill_seq_len < max(K)+1, ctx_len <= prefill_seq_len, or a CCL out
        of range.
    """
    ks = normalize_k_list(num_speculative_tokens)
    _check_shapes(ks, prefill_seq_len, ctx_len, batch_size, full_batch_size)
    lists = ccl_lists(comp_ctx_lengths, comp_ctx_lengths_prefill, ctx_len, prefill_seq_len)
    prefill_ccls, decode_ccls = lists if lists is not None else ([None], [None])
    cb = full_batch_size is not None
    specs = [
        Specialization(
            kind="prefill",
            batch_size=1 if cb else batch_size,
            seq_len=prefill_seq_len,
            ctx_len=ctx_len,
            num_logits_to_keep=1,
            full_batch_size=full_batch_size,
            comp_ctx_lengths=ccl,
        )
        for ccl in prefill_ccls
    ]
    for k in ks:
        for ccl in decode_ccls:
            specs.append(
                Specialization(
                    kind="decode",
                    batch_size=full_batch_size if cb else batch_size,
                    seq_len=k + 1,
                    ctx_len=ctx_len,
                    num_logits_to_keep=k + 1,
                    full_batch_size=full_batch_size,
                    k=k,
                    comp_ctx_lengths=ccl,
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
    num_speculative_tokens, prefill_seq_len, ctx_len, batch_size, full_batch_size,
    comp_ctx_lengths=None, comp_ctx_lengths_prefill=None,
) -> list[Specialization]:
    """Default specialize stage: :func:`specialize`."""
    return specialize(num_speculative_tokens, prefill_seq_len, ctx_len, batch_size, full_batch_size,
                      comp_ctx_lengths, comp_ctx_lengths_prefill)
