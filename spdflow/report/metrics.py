"""Run metrics computed from the engine's ``trace.jsonl``.

Every field of :class:`Metrics` carries its written definition in ``Field(description=...)``;
the report's glossary is generated from those descriptions, so the definition a reader sees is
the one the code implements. Names follow vLLM where the concept matches (mean acceptance
length, draft acceptance rate, per-position acceptance, TTFT, TPOT).

Trace record kinds (written by the engine, one JSON object per line):

* ``header`` (the first line): ``trace_version`` (:data:`TRACE_VERSION`), ``spdflow_version``.
  A trace without a header is version 1 (before per-row positions and raw proposal lengths).
* ``prefill``: ``t``, ``request``, ``slot``, ``chunks``, ``duration_s``
* ``step``: ``step``, ``t``, ``k``, ``batch``, ``propose_s``, ``verify_s``, ``host_s``,
  ``rows`` = [{``request``, ``slot``, ``position``, ``raw``, ``proposed``, ``accepted``, ``emitted``}]:
  ``position`` is the row's anchor position (its token count − 1) when the step started, ``raw``
  the proposer's proposal length before clipping to the step's K, ``proposed`` the verified
  length after clipping, ``accepted`` how many of those the target kept
* ``step_costs``: ``verify_s`` = {K: seconds} timed before the first step (policies that ask)
* ``cost_grid``: step costs of every compiled shape at the run's batch size, timed after the
  run (``spdflow.costs.measure_cost_grid``); the ``measured`` cost model reads it
* ``request``: ``request``, ``prompt_tokens``, ``generated_tokens``, ``ttft_s``, ``finish_s``,
  ``stop_reason``

All times are seconds since generation start.
"""
from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable

from pydantic import BaseModel, ConfigDict, Field

#: Number of equal-width bins of the tokens/s-over-time series.
TIME_BINS = 20

#: The trace format this spdflow writes; readers refuse newer ones (:func:`check_trace_version`).
TRACE_VERSION = 2


def trace_header(spdflow_version: str) -> dict:
    """The first record of every trace.jsonl."""
    return {"kind": "header", "trace_version": TRACE_VERSION, "spdflow_version": spdflow_version}


def trace_version(records: list[dict]) -> int:
    """The format version of a trace's records: its header's, or 1 for a trace without one."""
    for record in records:
        if record.get("kind") == "header":
            return record.get("trace_version", 0)
    return 1


def check_trace_version(records: list[dict], path, minimum: int = 1) -> int:
    """The trace's version; a TraceVersionError when this spdflow cannot read it (or, with
    ``minimum``, when it is older than a reader needs)."""
    from spdflow.errors import TraceVersionError

    version = trace_version(records)
    if not isinstance(version, int) or version > TRACE_VERSION or version < 1:
        raise TraceVersionError(f"'{path}' has trace format version {version!r}, which this spdflow (trace format "
                                f"{TRACE_VERSION}) cannot read", hint="upgrade spdflow, or rerun the recipe with this one")
    if version < minimum:
        raise TraceVersionError(f"'{path}' has trace format version {version}, written before replayable traces "
                                f"(version {minimum})", hint="rerun the recipe with this spdflow to record a replayable trace")
    return version


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestAcceptance(_Model):
    """Acceptance of one request over all its decode steps."""

    request: int = Field(description="Request index in the workload.")
    steps: int = Field(description="Decode steps (row-steps) the request took part in.")
    proposed: int = Field(description="Draft tokens proposed for the request (after clipping to its k_max).")
    accepted: int = Field(description="Draft tokens accepted for the request.")
    acceptance_rate: float | None = Field(
        description="accepted ÷ proposed for this request; null when nothing was proposed."
    )
    acceptance_length: float | None = Field(
        description="Σ(accepted + 1) ÷ steps for this request; null when it had no decode step."
    )


class StepCost(_Model):
    """Measured verify time of the decode steps that ran one (K, batch) shape."""

    k: int = Field(description="The K the step verified (decode shape seq_len K+1).")
    batch: int = Field(description="Rows of the step's batch (KV rows the shape runs).")
    steps: int = Field(description="Decode steps that ran this shape.")
    verify_median_s: float = Field(description="Median verify_s of those steps (s).")
    verify_p90_s: float = Field(description="90th percentile of verify_s of those steps (s).")
    verify_per_k0: float | None = Field(
        None, description="verify_median_s ÷ the K=0 median of the same batch: what verifying K costs relative "
        "to plain decoding; null without K=0 steps."
    )


class TimeBin(_Model):
    """One bin of the tokens-per-second-over-time series."""

    t_start: float = Field(description="Bin start, seconds since generation start.")
    t_end: float = Field(description="Bin end, seconds since generation start.")
    tokens: int = Field(description="Tokens produced in [t_start, t_end): first tokens at each request's TTFT, decode tokens at the end time of their step.")
    tokens_per_s: float = Field(description="tokens ÷ (t_end − t_start).")


class Metrics(_Model):
    """What a run did and how fast, computed by :func:`compute_metrics` from the trace."""

    # -- volume and latency ----------------------------------------------------------------
    requests: int = Field(description="Requests that finished (request records in the trace).")
    prompt_tokens: int = Field(description="Σ prompt tokens over finished requests.")
    generated_tokens: int = Field(
        description="Σ generated tokens over finished requests, including each request's first "
        "token (the one prefill produces)."
    )
    wall_s: float = Field(description="Generation wall time: the latest finish_s of any request (s).")
    ttft_mean_s: float | None = Field(
        description="Time to first token, mean over requests: the time from generation start until "
        "the request's first token existed (includes queueing behind other prefills) (s)."
    )
    ttft_median_s: float | None = Field(description="Time to first token, median over requests (s).")
    ttft_p90_s: float | None = Field(
        description="Time to first token, 90th percentile over requests, linear interpolation "
        "between closest ranks (numpy's default) (s)."
    )
    tpot_mean_s: float | None = Field(
        description="Time per output token after the first, mean over requests with ≥ 2 tokens of "
        "(finish_s − ttft_s) ÷ (generated_tokens − 1) (s)."
    )
    tpot_median_s: float | None = Field(description="Time per output token, median over the same per-request values (s).")
    stop_reasons: dict[str, int] = Field(description="Finished requests per stop reason (eos, max_new_tokens, ctx_len).")

    # -- throughput ------------------------------------------------------------------------
    decode_time_s: float = Field(
        description="Σ over decode steps of (propose_s + verify_s + host_s): time spent in decode "
        "steps, excluding prefill (s)."
    )
    prefill_time_s: float = Field(description="Σ duration_s of all prefill records (s).")
    decode_tokens: int = Field(
        description="Σ emitted over all rows of all decode steps: tokens produced by decode steps "
        "(equals Σ(generated_tokens − 1) when every request finished)."
    )
    decode_tokens_per_s: float | None = Field(
        description="Decode throughput: decode_tokens ÷ decode_time_s; null without decode time."
    )
    e2e_tokens_per_s: float | None = Field(
        description="End-to-end throughput: generated_tokens ÷ wall_s (prefill included)."
    )
    requests_per_s: float | None = Field(description="Request throughput: requests ÷ wall_s.")

    # -- speculation -----------------------------------------------------------------------
    decode_steps: int = Field(description="Decode steps (verify calls of the target).")
    row_steps: int = Field(description="Σ over decode steps of the number of active requests (rows).")
    proposed_tokens: int = Field(description="Σ proposed over all row-steps (vLLM num_draft_tokens).")
    accepted_tokens: int = Field(description="Σ accepted over all row-steps (vLLM num_accepted_tokens).")
    mean_acceptance_length: float | None = Field(
        description="Mean acceptance length (AL): Σ(accepted + 1) ÷ row-steps, i.e. tokens a request "
        "gains per decode step including the target's bonus token; 1.0 for no-spec, at most K+1. "
        "Steps where the request had no proposal count (as 1)."
    )
    mean_acceptance_length_drafted: float | None = Field(
        description="AL over row-steps that had ≥ 1 proposal only: 1 + Σaccepted ÷ (row-steps with "
        "proposed > 0) — vLLM's mean acceptance length (1 + accepted ÷ num_drafts); null when "
        "nothing was proposed."
    )
    draft_acceptance_rate: float | None = Field(
        description="Draft acceptance rate (AR): Σaccepted ÷ Σproposed; null when nothing was proposed."
    )
    proposal_rate: float | None = Field(
        description="Fraction of row-steps with at least one proposal; null without row-steps."
    )
    per_position_acceptance: list[float] = Field(
        description="Entry i (0-based draft position): row-steps whose accepted > i ÷ row-steps whose "
        "proposed > i — the acceptance of position i given a proposal reached it (conditional; "
        "vLLM's per-position counters divide by all drafts instead)."
    )
    per_position_proposed: list[int] = Field(
        description="Entry i: row-steps whose proposed > i (the denominator of per_position_acceptance)."
    )
    per_request: list[RequestAcceptance] = Field(description="AR and AL of each request, by request index.")
    k_histogram: dict[int, int] = Field(description="Decode steps per chosen K (K-usage histogram).")
    accepted_length_histogram: dict[int, int] = Field(
        description="Row-steps per accepted + 1 (tokens gained including the bonus token)."
    )
    verified_positions: int = Field(
        description="Σ over decode steps of batch × (K+1): token positions the target verified, "
        "counting every KV row in the run (idle rows too)."
    )
    padded_positions: int = Field(
        description="Σ over decode steps of (batch × K − Σproposed): verified positions that held no "
        "real proposal (padding for shorter proposals and idle rows)."
    )
    padded_slot_fraction: float | None = Field(
        description="padded_positions ÷ verified_positions: the share of verify work spent on "
        "positions that could not be accepted; null without decode steps."
    )

    # -- time split ------------------------------------------------------------------------
    propose_s: float = Field(description="Σ propose_s over decode steps (s).")
    verify_s: float = Field(description="Σ verify_s over decode steps (s).")
    host_s: float = Field(description="Σ host_s over decode steps: step time outside propose and verify (s).")
    propose_fraction: float | None = Field(description="propose_s ÷ decode_time_s.")
    verify_fraction: float | None = Field(description="verify_s ÷ decode_time_s.")
    host_fraction: float | None = Field(description="host_s ÷ decode_time_s.")
    tokens_over_time: list[TimeBin] = Field(
        description=f"Tokens/s over time: [0, wall_s] cut into {TIME_BINS} equal bins (kept in report.json; "
        "not plotted, since on short runs it shows prefill bursts rather than speed)."
    )
    step_costs: list[StepCost] = Field(
        default_factory=list,
        description="Measured verify time per (K, batch) from the decode steps that ran: the figure to "
        "choose a K-list by (a K that costs nearly as much as K+1 positions of acceptance gains nothing).",
    )

    # -- filled in by the engine -------------------------------------------------------------
    peak_rss_mb: float | None = Field(None, description="Peak resident memory of the run process (MiB); filled by the engine.")
    lossless: bool | None = Field(
        None,
        description="True when the output was token-identical to the no-spec baseline, false when "
        "not, null when not checked; filled by the engine.",
    )


# ------------------------------------------------------------------------------------------
# reading


def read_trace(path: Path) -> list[dict]:
    """The records of a ``trace.jsonl``.

    A final line that does not parse is skipped: an interrupted run may have died mid-write,
    and the complete records before it are still worth reporting.
    """
    records: list[dict] = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise
    return records


# ------------------------------------------------------------------------------------------
# small statistics helpers


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks.

    Same as ``numpy.percentile(values, q)``, written out so the definition is visible.
    """
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# ------------------------------------------------------------------------------------------
# the metric groups


def _latency(requests: list[dict]) -> dict:
    ttfts = [float(r["ttft_s"]) for r in requests]
    tpots = [
        (float(r["finish_s"]) - float(r["ttft_s"])) / (int(r["generated_tokens"]) - 1)
        for r in requests
        if int(r["generated_tokens"]) >= 2
    ]
    return {
        "ttft_mean_s": _mean(ttfts),
        "ttft_median_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "tpot_mean_s": _mean(tpots),
        "tpot_median_s": percentile(tpots, 50),
        "stop_reasons": dict(sorted(Counter(str(r["stop_reason"]) for r in requests).items())),
    }


def _acceptance(steps: list[dict]) -> dict:
    rows = [row for step in steps for row in step["rows"]]
    proposed = sum(int(r["proposed"]) for r in rows)
    accepted = sum(int(r["accepted"]) for r in rows)
    drafted = [r for r in rows if int(r["proposed"]) > 0]
    max_proposed = max((int(r["proposed"]) for r in rows), default=0)
    reached = [sum(1 for r in rows if int(r["proposed"]) > i) for i in range(max_proposed)]
    kept = [sum(1 for r in rows if int(r["accepted"]) > i) for i in range(max_proposed)]
    return {
        "row_steps": len(rows),
        "proposed_tokens": proposed,
        "accepted_tokens": accepted,
        "mean_acceptance_length": _ratio(sum(int(r["accepted"]) + 1 for r in rows), len(rows)),
        "mean_acceptance_length_drafted": (
            1 + sum(int(r["accepted"]) for r in drafted) / len(drafted) if drafted else None
        ),
        "draft_acceptance_rate": _ratio(accepted, proposed),
        "proposal_rate": _ratio(len(drafted), len(rows)),
        "per_position_acceptance": [k / n for k, n in zip(kept, reached)],
        "per_position_proposed": reached,
        "per_request": _per_request(rows),
        "accepted_length_histogram": dict(sorted(Counter(int(r["accepted"]) + 1 for r in rows).items())),
    }


def _per_request(rows: list[dict]) -> list[RequestAcceptance]:
    by_request: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        by_request[int(row["request"])].append(row)
    result = []
    for request, mine in sorted(by_request.items()):
        proposed = sum(int(r["proposed"]) for r in mine)
        accepted = sum(int(r["accepted"]) for r in mine)
        result.append(
            RequestAcceptance(
                request=request,
                steps=len(mine),
                proposed=proposed,
                accepted=accepted,
                acceptance_rate=_ratio(accepted, proposed),
                acceptance_length=_ratio(accepted + len(mine), len(mine)),
            )
        )
    return result


def _shape_use(steps: list[dict]) -> dict:
    verified = sum(int(s["batch"]) * (int(s["k"]) + 1) for s in steps)
    padded = sum(
        int(s["batch"]) * int(s["k"]) - sum(int(r["proposed"]) for r in s["rows"]) for s in steps
    )
    return {
        "k_histogram": dict(sorted(Counter(int(s["k"]) for s in steps).items())),
        "verified_positions": verified,
        "padded_positions": padded,
        "padded_slot_fraction": _ratio(padded, verified),
    }


def _time_split(steps: list[dict], prefills: list[dict]) -> dict:
    propose = sum(float(s["propose_s"]) for s in steps)
    verify = sum(float(s["verify_s"]) for s in steps)
    host = sum(float(s["host_s"]) for s in steps)
    decode = propose + verify + host
    return {
        "decode_time_s": decode,
        "prefill_time_s": sum(float(p["duration_s"]) for p in prefills),
        "propose_s": propose,
        "verify_s": verify,
        "host_s": host,
        "propose_fraction": _ratio(propose, decode),
        "verify_fraction": _ratio(verify, decode),
        "host_fraction": _ratio(host, decode),
    }


def step_costs(steps: list[dict]) -> list[StepCost]:
    """Median and p90 verify time of the steps per (K, batch), with the ratio to K=0 of that batch."""
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for s in steps:
        groups[(int(s["k"]), int(s["batch"]))].append(float(s["verify_s"]))
    medians = {key: percentile(values, 50) for key, values in groups.items()}
    return [
        StepCost(k=k, batch=batch, steps=len(groups[(k, batch)]), verify_median_s=medians[(k, batch)],
                 verify_p90_s=percentile(groups[(k, batch)], 90),
                 verify_per_k0=_ratio(medians[(k, batch)], medians.get((0, batch)) or 0.0))
        for k, batch in sorted(groups, key=lambda kb: (kb[1], kb[0]))
    ]


def tokens_over_time(
    requests: list[dict], steps: list[dict], wall_s: float, bins: int = TIME_BINS
) -> list[TimeBin]:
    """Tokens/s in ``bins`` equal bins over [0, wall_s].

    A request's first token counts at its ttft_s; decode tokens count at their step's ``t``
    (the end of the step). A time equal to wall_s falls in the last bin.
    """
    if wall_s <= 0 or bins <= 0:
        return []
    width = wall_s / bins
    counts = [0] * bins
    events = [(float(r["ttft_s"]), 1) for r in requests if int(r["generated_tokens"]) > 0]
    events += [(float(s["t"]), sum(int(r["emitted"]) for r in s["rows"])) for s in steps]
    for t, tokens in events:
        index = min(max(int(t / width), 0), bins - 1)
        counts[index] += tokens
    return [
        TimeBin(t_start=i * width, t_end=(i + 1) * width, tokens=n, tokens_per_s=n / width)
        for i, n in enumerate(counts)
    ]


def compute_metrics(records: Iterable[dict]) -> Metrics:
    """The :class:`Metrics` of one run from its trace records (any order, any mix of kinds)."""
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_kind[record.get("kind", "")].append(record)
    requests = sorted(by_kind["request"], key=lambda r: int(r["request"]))
    steps = sorted(by_kind["step"], key=lambda s: int(s["step"]))
    prefills = by_kind["prefill"]

    generated = sum(int(r["generated_tokens"]) for r in requests)
    wall = max((float(r["finish_s"]) for r in requests), default=0.0)
    split = _time_split(steps, prefills)
    decode_tokens = sum(int(r["emitted"]) for s in steps for r in s["rows"])
    return Metrics(
        requests=len(requests),
        prompt_tokens=sum(int(r["prompt_tokens"]) for r in requests),
        generated_tokens=generated,
        wall_s=wall,
        **_latency(requests),
        decode_tokens=decode_tokens,
        decode_tokens_per_s=_ratio(decode_tokens, split["decode_time_s"]),
        e2e_tokens_per_s=_ratio(generated, wall),
        requests_per_s=_ratio(len(requests), wall),
        decode_steps=len(steps),
        **_acceptance(steps),
        **_shape_use(steps),
        **split,
        tokens_over_time=tokens_over_time(requests, steps, wall),
        step_costs=step_costs(steps),
    )


def glossary() -> dict[str, str]:
    """Metric name -> written definition, from the field descriptions (for report glossaries)."""
    return {name: field.description or "" for name, field in Metrics.model_fields.items()}
