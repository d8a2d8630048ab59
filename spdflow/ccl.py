"""Compute context lengths (CCL): how many KV-cache slots a compiled shape reads.

A KV cache of ``ctx_len`` slots is written in place whatever the step; with CCLs the graph's
attention reads only the first ``comp_ctx_lengths`` slots (the length of the graph input of
that name, as QEfficient does it), so a step of a short sequence does not score the whole
cache. Every shape is compiled once per CCL; at run time the smallest CCL that holds every live
sequence of the step (its last position + 1, the K being verified included) is chosen.

The settings are the backend's (``devices.with.comp_ctx_lengths`` and
``comp_ctx_lengths_prefill``, both qaic and onnxruntime); ``spdflow_specialize`` turns them into
shapes (``spdflow_shapes.ccl_lists``), lint checks them (SPD121-SPD123).
"""
from __future__ import annotations

from typing import Annotated, Sequence

import numpy as np
from pydantic import BaseModel, Field

_CCL_HELP = (
    "Compute context lengths (CCL): every decode shape (and the prefill) is also compiled reading "
    "only the first CCL slots of the KV cache, and each step runs the smallest CCL that holds its "
    "longest sequence. Ascending, each <= ctx_len; ctx_len is added when missing. Unset: every "
    "shape reads the whole cache."
)


class CclSettings(BaseModel):
    """The CCL fields of a backend's ``devices.with:`` block (qaic and onnxruntime)."""

    comp_ctx_lengths: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, min_length=1, description=_CCL_HELP
    )
    comp_ctx_lengths_prefill: list[Annotated[int, Field(ge=1)]] | None = Field(
        None,
        min_length=1,
        description="The prefill's own compute context lengths (each >= prefill_seq_len); unset: "
        "those of comp_ctx_lengths that are >= prefill_seq_len.",
    )


def pick_ccl(positions: np.ndarray, available: Sequence[int]) -> int:
    """The smallest of ``available`` (ascending, ending with ctx_len) that holds every position
    of ``positions``: a step whose last position is p reads slots 0..p, so it needs CCL > p.

    Padding positions (-1) need nothing. When nothing is long enough the largest is returned
    (positions beyond ctx_len are the caller's error, reported where it is made).
    """
    need = int(positions.max(initial=-1)) + 1
    for ccl in available:
        if ccl >= need:
            return int(ccl)
    return int(available[-1])
