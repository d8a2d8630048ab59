"""Every metric definition checked against a hand-made trace with numbers worked out by hand."""
from __future__ import annotations

import json

import pytest

from spdflow.report.metrics import Metrics, compute_metrics, glossary, percentile, read_trace


def step(n, t, k, batch, rows, propose=0.05, verify=0.2, host=0.05):
    return {
        "kind": "step", "step": n, "t": t, "k": k, "batch": batch,
        "propose_s": propose, "verify_s": verify, "host_s": host,
        "rows": [
            {"request": r, "slot": r, "proposed": p, "accepted": a, "emitted": e}
            for r, p, a, e in rows
        ],
    }


@pytest.fixture
def spec_trace():
    """Two requests, batch 2, K-list [0, 4]; three steps (K=4, K=0, K=4).

    request 0: proposed 4/0/4, accepted 2/0/4 -> emitted 3/1/5, 1 + 9 = 10 tokens
    request 1: proposed 2/0/3, accepted 0/0/1 -> emitted 1/1/2, 1 + 4 = 5 tokens
    """
    return [
        {"kind": "prefill", "t": 0.1, "request": 0, "slot": 0, "chunks": 1, "duration_s": 0.1},
        {"kind": "prefill", "t": 0.2, "request": 1, "slot": 1, "chunks": 2, "duration_s": 0.1},
        step(0, 0.52, 4, 2, [(0, 4, 2, 3), (1, 2, 0, 1)]),
        step(1, 0.71, 0, 2, [(0, 0, 0, 1), (1, 0, 0, 1)], propose=0.02, verify=0.1, host=0.02),
        step(2, 0.98, 4, 2, [(0, 4, 4, 5), (1, 3, 1, 2)]),
        {"kind": "request", "request": 1, "prompt_tokens": 30, "generated_tokens": 5,
         "ttft_s": 0.2, "finish_s": 1.0, "stop_reason": "max_new_tokens"},
        {"kind": "request", "request": 0, "prompt_tokens": 20, "generated_tokens": 10,
         "ttft_s": 0.1, "finish_s": 1.0, "stop_reason": "eos"},
    ]


@pytest.fixture
def m(spec_trace) -> Metrics:
    return compute_metrics(spec_trace)


def test_volume_and_wall_time(m):
    assert (m.requests, m.prompt_tokens, m.generated_tokens) == (2, 50, 15)
    assert m.wall_s == 1.0
    assert m.stop_reasons == {"eos": 1, "max_new_tokens": 1}


def test_ttft_is_mean_median_and_interpolated_p90(m):
    assert m.ttft_mean_s == pytest.approx(0.15)
    assert m.ttft_median_s == pytest.approx(0.15)
    assert m.ttft_p90_s == pytest.approx(0.19)  # 0.1 + 0.9 * (0.2 - 0.1)


def test_tpot_is_time_after_first_token_per_later_token(m):
    # request 0: (1.0 - 0.1) / 9 = 0.1; request 1: (1.0 - 0.2) / 4 = 0.2
    assert m.tpot_mean_s == pytest.approx(0.15)
    assert m.tpot_median_s == pytest.approx(0.15)


def test_tpot_skips_single_token_requests():
    records = [
        {"kind": "request", "request": 0, "prompt_tokens": 3, "generated_tokens": 1,
         "ttft_s": 0.5, "finish_s": 0.5, "stop_reason": "eos"},
    ]
    metrics = compute_metrics(records)
    assert metrics.tpot_mean_s is None and metrics.ttft_mean_s == 0.5


def test_throughputs(m):
    assert m.decode_time_s == pytest.approx(0.74)  # 0.3 + 0.14 + 0.3
    assert m.decode_tokens == 13  # 15 generated - 2 first tokens
    assert m.decode_tokens_per_s == pytest.approx(13 / 0.74)
    assert m.e2e_tokens_per_s == pytest.approx(15.0)
    assert m.requests_per_s == pytest.approx(2.0)
    assert m.prefill_time_s == pytest.approx(0.2)


def test_mean_acceptance_length_counts_the_bonus_token_over_all_row_steps(m):
    assert (m.decode_steps, m.row_steps) == (3, 6)
    assert m.mean_acceptance_length == pytest.approx(13 / 6)  # (3+1+1+1+5+2) / 6
    assert m.mean_acceptance_length_drafted == pytest.approx(1 + 7 / 4)


def test_draft_acceptance_rate(m):
    assert (m.proposed_tokens, m.accepted_tokens) == (13, 7)
    assert m.draft_acceptance_rate == pytest.approx(7 / 13)
    assert m.proposal_rate == pytest.approx(4 / 6)


def test_per_position_acceptance_is_conditional_on_reaching_the_position(m):
    # proposed 4,2,4,3 / accepted 2,0,4,1 on the drafted row-steps
    assert m.per_position_proposed == [4, 4, 3, 2]
    assert m.per_position_acceptance == pytest.approx([3 / 4, 2 / 4, 1 / 3, 1 / 2])


def test_per_request_acceptance(m):
    first, second = m.per_request
    assert (first.request, first.steps, first.proposed, first.accepted) == (0, 3, 8, 6)
    assert first.acceptance_rate == pytest.approx(0.75)
    assert first.acceptance_length == pytest.approx(3.0)  # (6 + 3) / 3
    assert (second.proposed, second.accepted) == (5, 1)
    assert second.acceptance_rate == pytest.approx(0.2)
    assert second.acceptance_length == pytest.approx(4 / 3)


def test_histograms(m):
    assert m.k_histogram == {0: 1, 4: 2}
    assert m.accepted_length_histogram == {1: 3, 2: 1, 3: 1, 5: 1}


def test_padded_slot_fraction_counts_unfilled_verified_positions(m):
    assert m.verified_positions == 22  # 2*5 + 2*1 + 2*5
    assert m.padded_positions == 3  # (8 - 6) + 0 + (8 - 7)
    assert m.padded_slot_fraction == pytest.approx(3 / 22)


def test_padded_slot_fraction_counts_idle_kv_rows():
    # batch 4 (continuous batching), one active row proposing 1 of K=2
    metrics = compute_metrics([step(0, 0.1, 2, 4, [(0, 1, 1, 2)])])
    assert metrics.verified_positions == 12
    assert metrics.padded_positions == 7  # 4*2 - 1
    assert metrics.padded_slot_fraction == pytest.approx(7 / 12)


def test_time_split(m):
    assert (m.propose_s, m.verify_s, m.host_s) == pytest.approx((0.12, 0.5, 0.12))
    assert m.propose_fraction == pytest.approx(0.12 / 0.74)
    assert m.verify_fraction == pytest.approx(0.5 / 0.74)
    assert m.host_fraction == pytest.approx(0.12 / 0.74)


def test_tokens_over_time_bins_first_tokens_at_ttft_and_decode_tokens_at_step_end(m):
    bins = m.tokens_over_time
    assert len(bins) == 20 and bins[0].t_start == 0 and bins[-1].t_end == pytest.approx(1.0)
    tokens = {i: b.tokens for i, b in enumerate(bins) if b.tokens}
    assert tokens == {2: 1, 4: 1, 10: 4, 14: 2, 19: 7}
    assert bins[10].tokens_per_s == pytest.approx(4 / 0.05)
    assert sum(b.tokens for b in bins) == m.generated_tokens


def test_nospec_trace():
    records = [step(i, 0.1 * (i + 1), 0, 1, [(0, 0, 0, 1)], propose=0.0) for i in range(4)]
    records.append({"kind": "request", "request": 0, "prompt_tokens": 8, "generated_tokens": 5,
                    "ttft_s": 0.05, "finish_s": 0.4, "stop_reason": "max_new_tokens"})
    metrics = compute_metrics(records)
    assert metrics.mean_acceptance_length == 1.0
    assert metrics.draft_acceptance_rate is None
    assert metrics.mean_acceptance_length_drafted is None
    assert metrics.per_position_acceptance == []
    assert metrics.k_histogram == {0: 4}
    assert metrics.padded_slot_fraction == 0.0
    assert metrics.proposal_rate == 0.0
    assert metrics.accepted_length_histogram == {1: 4}
    assert metrics.decode_tokens == 4 and metrics.propose_fraction == 0.0


def test_empty_trace_has_no_rates():
    metrics = compute_metrics([])
    assert metrics.requests == 0 and metrics.wall_s == 0.0
    assert metrics.mean_acceptance_length is None and metrics.padded_slot_fraction is None
    assert metrics.decode_tokens_per_s is None and metrics.tokens_over_time == []


def test_percentile_matches_numpy_linear():
    numpy = pytest.importorskip("numpy")
    values = [0.3, 0.1, 0.7, 0.2, 1.5]
    for q in (0, 10, 50, 90, 100):
        assert percentile(values, q) == pytest.approx(float(numpy.percentile(values, q)))


def test_read_trace_skips_a_truncated_last_line(tmp_path, spec_trace):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in spec_trace) + '{"kind": "st')
    assert read_trace(path) == spec_trace


def test_every_metric_has_a_written_definition():
    assert all(text.strip() for text in glossary().values())
