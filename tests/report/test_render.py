"""report.json / .md / .html writing, self-containment, round trip, terminal summary."""
from __future__ import annotations

import os
import re

import pytest

from spdflow.errors import SpdflowError
from spdflow.report import render
from spdflow.report.metrics import compute_metrics
from spdflow.report.model import (
    Artifact,
    ErrorRecord,
    Lossless,
    RunReport,
    StageRecord,
    collect_environment,
    load_report,
    make_artifact,
)


def make_records() -> list[dict]:
    """A small varK trace: one request, K-list [0, 4]."""
    records = [{"kind": "prefill", "t": 0.05, "request": 0, "slot": 0, "chunks": 1, "duration_s": 0.05}]
    plan = [(4, 4, 3), (0, 0, 0), (4, 2, 2), (4, 4, 4)]
    for n, (k, proposed, accepted) in enumerate(plan):
        records.append({
            "kind": "step", "step": n, "t": 0.1 * (n + 1), "k": k, "batch": 1,
            "propose_s": 0.01, "verify_s": 0.07, "host_s": 0.02,
            "rows": [{"request": 0, "slot": 0, "proposed": proposed, "accepted": accepted, "emitted": accepted + 1}],
        })
    records.append({"kind": "request", "request": 0, "prompt_tokens": 40, "generated_tokens": 14,
                    "ttft_s": 0.05, "finish_s": 0.4, "stop_reason": "max_new_tokens"})
    return records


def make_report(records=None, **changes) -> RunReport:
    fields = dict(
        run_id="tiny-varK-20260101T000000",
        status="ok",
        recipe={"version": 1, "name": "tiny-varK"},
        recipe_path="recipes/tiny.yaml",
        recipe_sha256="ab" * 32,
        spdflow_version="0.1.0",
        environment=collect_environment(),
        stages=[
            StageRecord(name="export", status="cached", reason="key unchanged", duration_s=0.01, cache_key="0123456789abcdef99"),
            StageRecord(name="compile", status="ran", reason="first run", duration_s=2.5),
            StageRecord(name="generate", status="ran", duration_s=0.4),
        ],
        artifacts=[Artifact(name="trace", path="trace.jsonl", sha256="cd" * 32, bytes=1234)],
        metrics=compute_metrics(records if records is not None else make_records()),
        lossless=Lossless(checked=True, identical=True, baseline="greedy no-spec, same backend"),
        peak_rss_mb=321.0,
        started_at="2026-01-01T00:00:00+00:00",
        duration_s=3.2,
    )
    fields.update(changes)
    return RunReport(**fields)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    records = make_records()
    return run_dir, render.write_report_files(run_dir, make_report(records), records)


def test_writes_the_three_files_and_plots(written):
    run_dir, paths = written
    assert {"json", "md", "html"} <= set(paths)
    assert {p.name for p in run_dir.iterdir()} == {"report.json", "report.md", "report.html", "plots"}
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == [
        "accepted_length.png", "k_usage.png", "per_position_acceptance.png", "tokens_over_time.png",
    ]


def test_json_round_trips_through_load_report(written):
    run_dir, paths = written
    report = load_report(paths["json"])
    assert report == load_report(run_dir)  # a run dir works too
    assert report.metrics.k_histogram == {0: 1, 4: 3}
    assert report.metrics.peak_rss_mb == 321.0 and report.metrics.lossless is True
    assert report.paths["report_html"] == "report.html"


def test_html_is_self_contained(written):
    _, paths = written
    page = paths["html"].read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 4
    # nothing fetched from elsewhere: no external src/href, no stylesheet links
    assert not re.search(r'(src|href)="(?!data:)', page)
    assert "<style>" in page and "Glossary" in page
    assert "draft_acceptance_rate" in page and "Σaccepted ÷ Σproposed" in page


def test_markdown_has_the_key_lines(written):
    _, paths = written
    text = paths["md"].read_text(encoding="utf-8")
    assert text.splitlines()[2].startswith("**OK · run tiny-varK-20260101T000000")
    for line in (
        "| Mean acceptance length (AL) | 3.25 |",  # (4 + 1 + 3 + 5) / 4
        "| Draft acceptance rate (AR) | 90.0 % |",  # 9 / 10
        "| K usage | K=0: 1 (25.0 %) · K=4: 3 (75.0 %) |",
        "| Padded-slot fraction | 12.5 % |",  # 2 padded of 5 + 1 + 5 + 5 verified
        "| Lossless | identical to the baseline (greedy no-spec, same backend) |",
        "| export | cached | key unchanged | 10.0 ms | 0123456789abcdef |",
        "| trace | trace.jsonl | 1,234 | cdcdcdcdcdcd |",
        "![K usage (decode steps per chosen K)](plots/k_usage.png)",
    ):
        assert line in text, line


def test_no_temp_files_are_left_and_old_report_is_replaced(tmp_path):
    (tmp_path / "report.json").write_text("old")
    render.write_report_files(tmp_path, make_report(), [])
    assert load_report(tmp_path).run_id == "tiny-varK-20260101T000000"
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    target.write_text("old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        render.write_atomic(target, "new")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]


def test_failed_run_without_metrics_renders_the_error(tmp_path):
    report = make_report(
        status="failed", metrics=None, lossless=None,
        error=ErrorRecord(stage="compile", message="qaic-compile exited with 255"),
    )
    paths = render.write_report_files(tmp_path, report, [])
    assert "compile: qaic-compile exited with 255" in paths["md"].read_text()
    assert "data:image/png" not in paths["html"].read_text()
    assert "plots" not in {p.name for p in tmp_path.iterdir()}


def test_metrics_are_filled_from_records_when_missing(tmp_path):
    records = make_records()
    render.write_report_files(tmp_path, make_report(metrics=None), records)
    engine_filled = {"peak_rss_mb", "lossless"}
    loaded = load_report(tmp_path).metrics.model_dump(exclude=engine_filled)
    assert loaded == compute_metrics(records).model_dump(exclude=engine_filled)


def test_load_report_rejects_a_bad_file_in_one_sentence(tmp_path):
    path = tmp_path / "report.json"
    path.write_text('{"report_version": 2}')
    with pytest.raises(SpdflowError, match=r"is not a valid spdflow run report: report_version"):
        load_report(path)
    with pytest.raises(SpdflowError, match="cannot read the run report"):
        load_report(tmp_path / "missing.json")


def test_make_artifact_records_relative_path_size_and_hash(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(b"abc")
    artifact = make_artifact(tmp_path, tmp_path / "sub" / "a.bin")
    assert artifact.path == "sub/a.bin" and artifact.bytes == 3
    assert artifact.sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_environment_reads_versions_without_importing(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    env = collect_environment()
    assert env.packages["numpy"] and "torch" not in sys.modules


def test_summary_table_shows_the_headline_numbers():
    from rich.console import Console

    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    console.print(render.summary_table(make_report()))
    text = console.export_text()
    assert "3.25" in text and "90.0 %" in text and "K=4: 3 (75.0 %)" in text and "identical" in text
