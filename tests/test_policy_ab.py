"""benchmarks/policy_ab.py: its arguments, the variants it registers, the pooled verdict, and one real cell."""
from __future__ import annotations

import json

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def ab():
    return load_benchmark("policy_ab")


def test_a_variant_is_a_name_goodput_fields_and_maybe_a_file(ab):
    assert ab.parse_variant("goodput_aa=") == ("goodput_aa", {}, None)
    assert ab.parse_variant("x=margin=0.1;grades=false") == ("x", {"margin": 0.1, "grades": False}, None)
    assert ab.parse_variant("y=margin=0.1@/tmp/goodput.py") == ("y", {"margin": 0.1}, "/tmp/goodput.py")
    for bad in ("goodput_aa", "=margin=1", "x=margin", "x=margin=fast"):
        with pytest.raises(ValueError, match="--variant"):
            ab.parse_variant(bad)


def test_cells_name_a_known_workload_and_a_batch_size(ab):
    assert ab.parse_cells("code:4,synthetic_0.3:1") == [("code", 4), ("synthetic_0.3", 1)]
    for bad, says in [("cod:4", "unknown workload 'cod'"), ("code", "needs a batch size"), ("code:0", "needs a batch"),
                      ("synthetic50m_0.3:1", "needs bench arguments"), ("", "at least one")]:
        with pytest.raises(ValueError, match=says):
            ab.parse_cells(bad)


def test_bad_arguments_exit_2_before_any_bench_runs(ab, tmp_path, capsys):
    assert ab.main(["--cells", "code:1", "--variant", "x=no_such_field=1", "--out", str(tmp_path)]) == 2
    assert "no_such_field" in capsys.readouterr().err
    assert ab.main(["--cells", "code:1", "--out", str(tmp_path)]) == 2  # no variant
    assert ab.main(["--out", str(tmp_path / "empty"), "--pool"]) == 2
    assert ab.main(["--cells", "code:1", "--variant", "x=", "--set", "devices.with.no_such_setting=1",
                    "--out", str(tmp_path)]) == 2
    assert "no_such_setting" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


def _result(cell, batch, goodput, variant, name="varK:goodput_x"):
    runs = {"varK:goodput": {str(r): {"tok_s": t, "steps": 10, "host_ms": 1.0} for r, t in enumerate(goodput)},
            name: {str(r): {"tok_s": t, "steps": 10, "host_ms": 2.0} for r, t in enumerate(variant)}}
    return {"cell": cell, "batch": batch, "repeats": len(goodput), "base": "varK:goodput", "runs": runs,
            "identical": True}


def test_pool_takes_the_median_over_every_processs_paired_repeats(ab, tmp_path, capsys):
    # code b4: paired 1.1, 1.2 (p1) and 0.9 (p2) -> pooled median 1.1; rare b8: 0.9 -> geometric mean sqrt(0.99)
    (tmp_path / "code_b4.p1.json").write_text(json.dumps(_result("code", 4, [100, 100], [110, 120])))
    (tmp_path / "code_b4.p2.json").write_text(json.dumps(_result("code", 4, [100], [90])))
    (tmp_path / "rare_b8.p1.json").write_text(json.dumps(_result("rare", 8, [200, 200, 200], [180, 170, 190])))
    assert ab.main(["--out", str(tmp_path), "--pool"]) == 0
    out = capsys.readouterr().out
    assert "| code b4 | varK:goodput_x | 1.100 | 1.150, 0.900 |" in out
    assert "| rare b8 | varK:goodput_x | 0.900 | 0.900 |" in out
    assert f"varK:goodput_x: geometric mean {0.99 ** 0.5:.4f} over 2 cells, 1 at or above 1.00" in out


def test_one_cell_runs_goodput_and_its_copy_with_no_spec_tokens(ab, tmp_path, capsys):
    assert ab.main(["--cells", "code:2", "--repeats", "1", "--count", "2", "--variant", "goodput_aa=",
                    "--set", "workload.max_new_tokens=24", "--out", str(tmp_path), "--tag", "t"]) == 0
    result = json.loads((tmp_path / "code_b2.t.json").read_text())
    assert result["identical"] is True and result["base"] == "varK:goodput"
    assert result["overrides"] == ["workload.max_new_tokens=24"]
    assert set(result["runs"]) == {"varK:goodput", "varK:goodput_aa"}
    assert all(run["tok_s"] > 0 and run["steps"] > 0 for runs in result["runs"].values() for run in runs.values())
    assert "every run's tokens equal the no-spec reference" in capsys.readouterr().out
