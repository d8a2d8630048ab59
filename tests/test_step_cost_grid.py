"""benchmarks/step_cost_grid.py: block shapes, the summary against generations, and CLI errors."""
from __future__ import annotations

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def grid():
    return load_benchmark("step_cost_grid")


def test_block_shapes_parse_and_bad_ones_say_what_is_wrong(grid):
    assert grid.parse_grids("1x2, 4x3") == [(1, 2), (4, 3)]
    for bad in ("4", "4x0", "ax3", "4x3,2"):
        with pytest.raises(ValueError, match="WARMUPxTIMED"):
            grid.parse_grids(bad)


def test_summary_compares_each_grid_with_the_generations_trial_by_trial(grid):
    # generations: K=0 1.0 s, K=2 1.4 s; grid "a" prices K=0 25 % high and squeezes the ratio,
    # grid "b" is right in one trial and 10 % high on both in the other (its ratios stay right)
    trials = [
        {"grids": {"a": {0: 1.25, 2: 1.5}, "b": {0: 1.0, 2: 1.4}}, "generations": {0: 1.0, 2: 1.4}},
        {"grids": {"a": {0: 2.5, 2: 3.0}, "b": {0: 2.2, 2: 3.08}}, "generations": {0: 2.0, 2: 2.8}},
        {"grids": {"a": {0: 1.25, 2: 1.5}, "b": {0: 1.0, 2: 1.4}}, "generations": {0: 1.0, 2: 1.4}},
    ]
    for seconds, trial in zip((0.2, 0.4, 0.3), trials):
        trial["seconds"] = {"a": seconds, "b": 2 * seconds}
    summary = grid.summarize(trials)
    assert (summary["a"]["seconds"], summary["b"]["seconds"]) == pytest.approx((0.3, 0.6))
    assert summary["a"]["k0"] == pytest.approx(1.25)
    assert summary["a"]["ratio"][2] == pytest.approx((1.5 / 1.25) / 1.4)
    assert summary["b"]["k0"] == pytest.approx(1.0)
    assert summary["b"]["ratio"][2] == pytest.approx(1.0)


@pytest.mark.parametrize("argv, message", [(["r.yaml", "--grids", "4"], "WARMUPxTIMED"),
                                           (["r.yaml", "--trials", "0"], "--trials must be at least 1"),
                                           (["r.yaml", "--batch-sizes", "1,0"], "--batch-sizes must be positive"),
                                           (["r.yaml", "--batch-sizes", "1,x"], "--batch-sizes must be positive")])
def test_bad_arguments_end_with_one_usage_line_and_exit_2(grid, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        grid.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
