"""benchmarks/host_gap.py: a busy-wait added to each step of a fixed-K mode, beside a policy."""
from __future__ import annotations

import pytest
from conftest import REPO, load_benchmark, run_table_benchmark


def test_host_gap_adds_the_delay_to_each_step_and_checks_the_tokens(tmp_path, capsys):
    rows = run_table_benchmark("host_gap", tmp_path, capsys, "--batch", "1", "--repeats", "1", "--delays", "0,2000",
                                  "--set", "workload.count=2", "--set", "workload.max_new_tokens=16", header="variant")
    assert set(rows) == {"fixed:2 +0 µs", "fixed:2 +2000 µs", "varK:goodput +0 µs"}
    # the busy-wait lies in every step's host time (so the median step's too), far above a step's own
    delayed, plain = float(rows["fixed:2 +2000 µs"][2]), float(rows["fixed:2 +0 µs"][2])
    assert delayed >= 2000 and delayed - plain >= 1000
    assert rows["fixed:2 +0 µs"][3].startswith("K=2: ") and rows["fixed:2 +2000 µs"][4] == rows["fixed:2 +0 µs"][4]
    assert all(r[-1] == "yes" for r in rows.values())
    from spdflow.engine.generate import Generator
    assert "delayed" not in Generator._call_policy.__qualname__  # the wrapping does not outlive the run


def test_host_gap_refuses_a_mode_that_is_not_fixed_and_bad_delays(capsys):
    module = load_benchmark("host_gap")
    recipe = str(REPO / "recipes" / "tinycode_varK.yaml")
    with pytest.raises(SystemExit):
        module.main([recipe, "--fixed", "goodput"])
    assert "not a fixed-K mode" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        module.main([recipe, "--delays", "fast"])
    assert "give µs as numbers" in capsys.readouterr().err


def test_host_gap_exits_1_when_a_runs_tokens_differ_from_no_spec(tmp_path, capsys, monkeypatch):
    import spdflow.bench

    monkeypatch.setattr(spdflow.bench, "reference_tokens", lambda bench: [[-1]])  # no run can equal it
    module = load_benchmark("host_gap")
    rc = module.main([str(REPO / "recipes" / "tinycode_varK.yaml"), "--batch", "1", "--repeats", "1", "--delays", "0",
                      "--policies", "", "--set", f"output={tmp_path / 'run'}", "--set", "workload.count=1",
                      "--set", "workload.max_new_tokens=8"])
    assert rc == 1
    out = capsys.readouterr().out
    assert "| fixed:2 +0 µs |" in out and out.rstrip().endswith("| **no** |")
