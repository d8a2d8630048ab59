"""Assemble the run report from the engine's state and write every report file."""
from __future__ import annotations

import time

from spdflow import __version__
from spdflow.engine import cache
from spdflow.engine.run import environment, peak_rss_mb, write_json, write_jsonl


def write_run_report(engine) -> dict:
    state = engine.state
    run_dir = engine.run_dir
    write_jsonl(run_dir / "trace.jsonl", state.records)
    write_jsonl(run_dir / "outputs.jsonl", state.outputs)
    report = {
        "report_version": 1,
        "run_id": state.run_id,
        "status": state.status,
        "recipe": engine.recipe.model_dump(mode="json", by_alias=True),
        "recipe_path": str(engine.loaded.path),
        "spdflow_version": __version__,
        "environment": environment(),
        "stages": [vars(s) for s in state.stages.values()],
        "error": state.error,
        "lossless": state.lossless,
        "peak_rss_mb": peak_rss_mb(),
        "duration_s": round(time.perf_counter() - state.t0, 3),
    }
    write_json(run_dir / "report.json", report)
    return report
