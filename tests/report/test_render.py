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
        "accepted_length.png", "k_usage.png", "per_position_acceptance.png", "step_cost.png",
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
        "| Mean acceptance length (AL, every step) | 3.25 |",  # (4 + 1 + 3 + 5) / 4
        "| AL over steps with a proposal (vLLM's definition) | 4.00 |",  # 1 + 9 / 3
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
    text = render.summary_table(make_report(recipe=RECIPE)).columns[1]._cells
    assert "spdflow:tinycode-target (float32)" in text and "[0, 4]" in text and "prompt_lookup (prompt_lookup_max=3)" in text


# ------------------------------------------------------------------------------- what ran, speed-up, step costs

RECIPE = {"version": 1, "name": "tiny-varK", "model": {"id": "spdflow:tinycode-target", "dtype": "float32"},
          "proposer": {"uses": "prompt_lookup", "with": {"prompt_lookup_max": 3}},
          "num_speculative_tokens": [4, 0], "k_policy": "goodput", "acceptance": "auto",
          "specialization": {"prefill_seq_len": 32, "ctx_len": 512, "batch_size": 1, "full_batch_size": 4},
          "devices": {"backend": "onnxruntime", "device_ids": [0]},
          "workload": {"builtin": "code", "count": 8, "max_new_tokens": 64, "temperature": 0.0, "seed": 0}}


def test_report_says_what_ran_with_overrides_and_effective_hash():
    report = make_report(recipe=RECIPE, overrides=["k_policy=goodput"], recipe_effective_sha256="ef" * 32)
    text = render.render_markdown(report)
    for line in ("| model | spdflow:tinycode-target (float32) |", "| proposer | prompt_lookup (prompt_lookup_max=3) |",
                 "| K-list | [0, 4] |", "| K policy | goodput; acceptance auto |",
                 "| batch | batch_size 1, continuous batching over 4 slots |",
                 "| workload | builtin code: 8 prompts, max_new_tokens 64 |", "| sampling | greedy (temperature 0), seed 0 |",
                 "| --set | k_policy=goodput |", "| recipe hash | efefefefefefefef (effective recipe;"):
        assert line in text, line
    assert "recipe hash" in render.render_html(report) and "k_policy=goodput" in render.render_html(report)


def test_a_policy_block_and_backend_settings_are_shown():
    recipe = {**RECIPE, "k_policy": {"uses": "goodput", "with": {"margin": 0.1}},
              "devices": {"backend": "qaic", "device_ids": [0, 1], "with": {"num_cores": 14}}}
    lines = dict(render.recipe_lines(make_report(recipe=recipe)))
    assert lines["K policy"].startswith("goodput (margin=0.1)") and lines["backend"] == "qaic on devices [0, 1] (num_cores=14)"


def test_speed_up_is_stated_when_a_baseline_ran_in_the_process():
    from spdflow.report.model import Baseline

    m = make_report().metrics
    baseline = Baseline(decode_tokens_per_s=m.decode_tokens_per_s / 2, e2e_tokens_per_s=m.e2e_tokens_per_s / 4,
                        tpot_median_s=m.tpot_median_s * 2)
    report = make_report(recipe=RECIPE, baseline=baseline)
    text = render.render_markdown(report)
    assert "| Speed-up: decode tokens/s vs no-spec | 2.00× (" in text and "| TPOT median vs no-spec (lower is better) | 0.50× (" in text
    assert "Measured against no-spec: decode ran at" in text and "— 2.00× (faster)" in text and "spdflow bench" in text
    assert "speed-up vs no-spec" in render.render_html(report)


def test_without_a_baseline_the_report_says_how_to_measure_the_speed_up():
    text = render.render_markdown(make_report())
    assert "rerun with --baseline (or --check-lossless)" in text


def test_gain_is_al_minus_one():
    text = render.render_markdown(make_report())
    assert "gained 2.25 extra tokens per request" in text and "(AL 3.25 tokens per step" in text


def test_step_cost_table_per_k_and_batch():
    text = render.render_markdown(make_report())
    assert "| 0 | 1 | 1 | 70.0 ms | 70.0 ms | 1.00× |" in text and "| 4 | 1 | 3 | 70.0 ms | 70.0 ms | 1.00× |" in text


def test_sampled_runs_that_differ_are_not_shouted_at():
    sampled = make_report(lossless=Lossless(checked=True, identical=False, mismatched_requests=[1],
                                            baseline="no-spec with the same seeds (sampled: identity not expected)"))
    verdict = render.lossless_verdict(sampled)
    assert "DIFFERS" not in verdict and "as expected when sampling" in verdict
    greedy = make_report(lossless=Lossless(checked=True, identical=False, mismatched_requests=[1], baseline="greedy no-spec"))
    assert render.lossless_verdict(greedy).startswith("NOT lossless")


def test_report_files_are_world_readable_like_the_other_outputs(tmp_path):
    old = os.umask(0o022)
    try:
        paths = render.write_report_files(tmp_path, make_report(), make_records())
    finally:
        os.umask(old)
    for key in ("json", "md", "html", "plot:k_usage"):
        assert paths[key].stat().st_mode & 0o777 == 0o644, key


def test_compile_only_report_says_generation_was_skipped():
    stages = [StageRecord(name="generate", status="skipped", reason="compile-only: nothing to run here")]
    text = render.render_markdown(make_report(metrics=None, lossless=None, stages=stages))
    assert "Generation was skipped (compile-only: nothing to run here)" in text


def test_timed_costs_of_every_compiled_k_join_the_step_cost_table():
    from spdflow.report.model import TimedCosts

    report = make_report(timed_costs=[TimedCosts(batch=1, verify_s={0: 0.02, 4: 0.03, 7: 0.04}, switch_s=0.005)])
    text = render.render_markdown(report)
    assert "| 7 (timed) | 1 | — | 40.0 ms | — | 2.00× |" in text and "after a change of K: batch 1: 5.0 ms." in text
