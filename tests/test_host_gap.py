"""benchmarks/host_gap.py: a busy-wait added to each step of a fixed-K mode, beside a policy."""
from __future__ import annotations

import pytest
from conftest import REPO, load_benchmark


def _rows(out: str) -> dict[str, list[str]]:
    return {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in out.splitlines() if line.startswith("| ") and not line.startswith("| variant")}


def test_host_gap_adds_the_delay_to_each_step_and_checks_the_tokens(tmp_path, capsys):
    module = load_benchmark("host_gap")
    rc = module.main([str(REPO / "recipes" / "tinycode_varK.yaml"), "--batch", "1", "--repeats", "1",
                      "--delays", "0,400", "--set", f"output={tmp_path / 'run'}",
                      "--set", "workload.count=2", "--set", "workload.max_new_tokens=16"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = _rows(out)
    assert set(rows) == {"fixed:2 +0 µs", "fixed:2 +400 µs", "varK:goodput +0 µs"}
    # the busy-wait lies in the step's host time: the median step's gap grows by about the delay
    assert float(rows["fixed:2 +400 µs"][2]) - float(rows["fixed:2 +0 µs"][2]) >= 350
    assert rows["fixed:2 +0 µs"][3].startswith("K=2: ") and rows["fixed:2 +400 µs"][4] == rows["fixed:2 +0 µs"][4]
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
