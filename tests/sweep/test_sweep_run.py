"""Running a sweep with the local executor: report, shared cache, resume, failures, interrupts."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from spdflow.cli import cli
from spdflow.sweep.executors import LocalExecutor, Needs, Task


def points(out: Path) -> dict[str, dict]:
    return {p["id"]: p for p in json.loads((out / "sweep.json").read_text())["points"]}


def stage_statuses(out: Path, stage: str) -> list[str]:
    reports = [json.loads(p.read_text()) for p in sorted((out / "points").glob("*/report.json"))]
    return sorted(next(s["status"] for s in r["stages"] if s["name"] == stage) for r in reports)


def test_local_sweep_runs_every_point_and_writes_one_report(local_sweep):
    result = local_sweep["result"]
    assert result.exit_code == 0, result.output
    sweep = json.loads(result.stdout)
    assert sweep["sweep_version"] == 1 and sweep["status"] == "ok" and sweep["executor"] == "local"
    assert len(sweep["points"]) == 4
    for point in sweep["points"]:
        assert point["status"] == "ok" and point["ran"] == "now", point
        assert point["metrics"]["lossless"] is True  # greedy SpD equals greedy no-spec, per point
        assert point["metrics"]["decode_tokens_per_s"] > 0 and point["metrics"]["acceptance_length"] >= 1
        assert point["outputs_sha256"]
    assert {(p["proposer"], tuple(p["k_list"])) for p in sweep["points"]} == {
        (u, k) for u in ("prompt_lookup", "suffix") for k in ((0, 2), (0, 3))}
    # the same prompts give the same tokens whatever the proposer and K-list (lossless)
    assert len({p["outputs_sha256"] for p in sweep["points"]}) == 1
    ids = {p["id"] for p in sweep["points"]}
    assert set(sweep["best"]) == {"decode_tokens_per_s", "e2e_tokens_per_s", "acceptance_length", "tpot_median_ms"}
    assert all(best["point"] in ids for best in sweep["best"].values())
    out = local_sweep["out"]
    markdown = (out / "sweep.md").read_text()
    assert all(point_id in markdown for point_id in ids) and "best:" in markdown
    assert "plots/throughput_batch1.png" in markdown and (out / "plots" / "throughput_batch1.png").stat().st_size > 1000
    html = (out / "sweep.html").read_text()
    assert "data:image/png;base64," in html and all(point_id in html for point_id in ids)


def test_points_share_one_export_and_one_program_per_k_list(local_sweep):
    out = local_sweep["out"]
    assert len(list((out / "cache" / "export").glob("target-*"))) == 1
    # two points ran at once (--jobs 2, threads 1): one built the export, the other waited for it
    assert stage_statuses(out, "export") == ["cached", "cached", "cached", "ran"]
    assert stage_statuses(out, "compile") == ["cached", "cached", "ran", "ran"]
    assert not list((out / "cache" / "export").glob("*/.*.tmp")) and not list((out / "cache" / "export").glob(".*.tmp"))


def test_rerun_skips_finished_points_with_a_reason(local_sweep):
    result = CliRunner().invoke(cli, ["sweep", str(local_sweep["path"]), "--json"])
    assert result.exit_code == 0, result.output
    sweep = json.loads(result.stdout)
    assert all(p["ran"] == "earlier" and p["status"] == "ok" for p in sweep["points"])
    assert all(p["reason"].startswith("finished earlier") for p in sweep["points"])
    assert "skipped — finished earlier" in result.stderr
    dry = CliRunner().invoke(cli, ["sweep", str(local_sweep["path"]), "--dry-run"])
    assert dry.stdout.count("[finished earlier]") == 4


def test_a_failed_point_is_reported_and_spoils_no_other(tmp_path, sweep_file):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    path = sweep_file(tmp_path, tmp_path / "out", tokens=6)
    matrix = "matrix:\n  proposer.uses: [prompt_lookup, suffix]\n  num_speculative_tokens: [[0, 2], [0, 3]]\n"
    text = path.read_text()
    assert matrix in text
    path.write_text(text.replace(matrix, "matrix:\n  num_speculative_tokens: [[0, 2]]\ninclude:\n  - {model.id: ./broken-model}\n"))
    result = CliRunner().invoke(cli, ["sweep", str(path), "-q", "--json"])
    assert result.exit_code == 1, result.output
    sweep = json.loads(result.stdout)
    by_status = {p["status"]: p for p in sweep["points"]}
    assert set(by_status) == {"ok", "failed"} and sweep["status"] == "failed"
    assert by_status["failed"]["reason"] and by_status["failed"]["exit_code"] == 1
    assert "1 of 2 points did not finish" in result.stderr
    assert "best" in sweep and sweep["best"]["acceptance_length"]["point"] == by_status["ok"]["id"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_killing_a_sweep_midway_then_rerunning_completes_only_the_missing_points(tmp_path, signum, sweep_file):
    out = tmp_path / "out"
    path = sweep_file(tmp_path, out)
    command = [sys.executable, "-m", "spdflow", "sweep", str(path), "--jobs", "1"]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if (out / "sweep.json").is_file() and any(p["status"] == "ok" for p in points(out).values()):
                break
            time.sleep(0.05)
        assert process.poll() is None, "the sweep finished before it could be interrupted"
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "rerun `spdflow sweep" in stderr
    first = points(out)
    assert json.loads((out / "sweep.json").read_text())["status"] == "interrupted"
    done = {i for i, p in first.items() if p["status"] == "ok"}
    assert 1 <= len(done) < 4, first
    assert all(p["status"] in ("interrupted", "not_run") for i, p in first.items() if i not in done)
    assert not list((out / "cache" / "export").glob(".*.tmp"))  # nothing half-written is left as an entry

    rerun = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    second = points(out)
    assert {i for i, p in second.items() if p["ran"] == "earlier"} == done
    assert {i for i, p in second.items() if p["ran"] == "now"} == set(second) - done
    assert all(p["status"] == "ok" and p["metrics"]["lossless"] is True for p in second.values())


def test_local_executor_never_shares_a_device_or_exceeds_the_cores():
    executor = LocalExecutor(jobs=8)
    executor.cores = 4
    card = lambda ids, cpus=1: Task("t", {}, Needs(cpus=cpus, resource="qaic", device_ids=ids))  # noqa: E731
    assert not executor._fits(card((0, 1)), [card((1, 2))])
    assert executor._fits(card((0, 1)), [card((2, 3))])
    assert not executor._fits(card((4,), cpus=2), [card((5,), cpus=3)])
    host = Task("h", {}, Needs(cpus=None))  # threads unset: all cores, so it runs alone
    assert not executor._fits(host, [card((9,))]) and executor._fits(host, [])
