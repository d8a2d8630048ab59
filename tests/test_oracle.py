"""The oracle K schedule: exact shortest path (checked against brute force), never slower than
any static choice, and the policy's efficiency and regret priced alike."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from spdflow.api import CostModel
from spdflow.cli import cli
from spdflow.oracle import best_schedule, oracle_report
from spdflow.plugins import get_plugin_manager
from spdflow.testing.fixtures import CODE_PROMPTS, run_in_process, tiny_recipe, write_recipe
from spdflow.whatif import load_run


class Costs(CostModel):
    """Made-up step costs; ``includes_host`` so a replay's time is priced time only (exact)."""

    name = "made-up"
    includes_host = True

    def __init__(self, verify: dict[int, float], switch: float = 0.0, prefill: float = 0.003):
        self.verify, self.switch, self.prefill = verify, switch, prefill

    def verify_s(self, batch, k):
        return self.verify[k]

    def switch_s(self, batch):
        return self.switch

    def prefill_s(self, batch, seq_len):
        return self.prefill

    def describe(self):
        return {"cost_model": self.name}


def brute_force(m, n, ks, cost) -> float:
    """Every schedule, recursively (small n only)."""
    def go(e, previous):
        if e >= n:
            return 0.0
        best = float("inf")
        for k in ks:
            step = min(k, int(m[e]), n - e - 1) + 1
            t = cost.verify[k] + (cost.switch if k != previous else 0.0) + go(e + step, k)
            best = min(best, t)
        return best
    return go(1, "prefill")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 14), data=st.data())
def test_best_schedule_is_the_shortest_path(n, data):
    m = np.array([0] + data.draw(st.lists(st.integers(0, 6), min_size=max(n - 1, 0), max_size=max(n - 1, 0))) + [0])
    ks = sorted(data.draw(st.sets(st.integers(1, 6), min_size=0, max_size=3)) | {0})
    verify = {k: data.draw(st.floats(0.5, 5.0)) for k in ks}
    cost = Costs(verify, switch=data.draw(st.floats(0.0, 2.0)))
    total, schedule = best_schedule(m, n, ks, cost)
    assert total == pytest.approx(brute_force(m, n, ks, cost) if n > 1 else 0.0)
    # the schedule reaches the end and costs what it says
    e, t, previous = 1, 0.0, "prefill"
    for k in schedule:
        t += verify[k] + (cost.switch if k != previous else 0.0)
        e += min(k, int(m[e]), n - e - 1) + 1
        previous = k
    assert (e >= n or n <= 1) and t == pytest.approx(total)


def test_best_schedule_speculates_where_proposals_hold_and_not_where_they_fail():
    cost = Costs({0: 1.0, 4: 2.0})
    assert best_schedule(np.full(21, 4), 21, [0, 4], cost)[1] == [4, 4, 4, 4]  # 1 + 4 x 5 tokens
    assert best_schedule(np.zeros(6), 6, [0, 4], cost)[1] == [0] * 5


@pytest.fixture(scope="module")
def greedy_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("oracle")
    recipe = tiny_recipe("spdflow:tinycode-target", base / "run", name="oracle", prompts=CODE_PROMPTS[:3],
                         max_new_tokens=40, proposer={"uses": "prompt_lookup",
                                                      "with": {"prompt_lookup_min": 1, "prompt_lookup_max": 3}},
                         k_list=(0, 2, 4, 7))
    run_in_process(get_plugin_manager(), write_recipe(base / "recipe.yaml", recipe), check_lossless=False)
    return base / "run"


def test_oracle_is_never_slower_than_the_policy_or_any_static_choice(greedy_run):
    pm = get_plugin_manager()
    run = load_run(greedy_run, pm)
    cost = Costs({0: 0.010, 2: 0.013, 4: 0.016, 7: 0.021}, switch=0.001)
    report = oracle_report(pm, run, cost, "smallest_covering")
    static = [report.nospec_tokens_per_s, *report.fixed_tokens_per_s.values()]
    assert report.oracle_tokens_per_s >= max(static) * (1 - 1e-9)
    assert report.oracle_tokens_per_s >= report.policy_tokens_per_s * (1 - 1e-9)
    assert report.efficiency == pytest.approx(report.policy_tokens_per_s / report.oracle_tokens_per_s)
    assert report.regret == pytest.approx(report.policy_tokens_per_s / max(static) - 1)
    assert sum(report.oracle_k_usage.values()) == report.oracle_steps
    # when speculating costs nothing extra, the oracle always drafts the most it can use
    flat = oracle_report(pm, run, Costs({0: 0.01, 2: 0.01, 4: 0.01, 7: 0.01}), "smallest_covering")
    assert flat.oracle_tokens_per_s == pytest.approx(flat.fixed_tokens_per_s[7], rel=1e-9)


def test_whatif_oracle_cli_prints_efficiency_and_regret(greedy_run):
    result = CliRunner().invoke(cli, ["whatif", str(greedy_run), "--oracle", "--cost", "roofline", "--cost-with", "profile=ai100-ultra", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert 0 < data["policy_efficiency"] <= 1 + 1e-9 and "regret_vs_best_static" in data
    text = CliRunner().invoke(cli, ["whatif", str(greedy_run), "--oracle", "--cost", "roofline", "--cost-with", "profile=ai100-ultra"]).output
    assert "policy efficiency" in text and "| oracle (" in text
