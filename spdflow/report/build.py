"""Assemble the RunReport from the engine's state and write every report file."""
from __future__ import annotations

import time
from pathlib import Path

from spdflow import __version__
from spdflow.files import canonical_json, sha256_file, sha256_text, write_jsonl_atomic, write_text_atomic
from spdflow.report.metrics import compute_metrics, trace_header
from spdflow.report.model import (
    Artifact,
    Baseline,
    ErrorRecord,
    Lossless,
    OracleSection,
    PluginRecord,
    RunReport,
    StageRecord,
    TimedCosts,
    collect_environment,
    make_artifact,
    peak_rss_mb,
)
from spdflow.report.render import write_report_files


def write_run_report(engine) -> RunReport:
    """Write trace.jsonl, outputs.jsonl and report.json/.md/.html (+ plots) into the run dir."""
    state = engine.state
    run_dir = engine.run_dir
    write_jsonl_atomic(run_dir / "trace.jsonl", [trace_header(__version__)] + state.records)
    write_jsonl_atomic(run_dir / "outputs.jsonl", state.outputs)
    has_steps = any(r.get("kind") == "request" for r in state.records)
    metrics = compute_metrics(state.records) if has_steps else None
    report = RunReport(
        run_id=state.run_id,
        status=state.status if state.status in ("ok", "failed", "interrupted") else "failed",
        recipe=engine.recipe.model_dump(mode="json", by_alias=True),
        recipe_path=str(engine.loaded.path),
        recipe_sha256=_recipe_sha256(engine.loaded.path),
        overrides=list(getattr(engine.loaded, "overrides", []) or []),
        recipe_effective_sha256=effective_recipe_sha256(engine.recipe),
        spdflow_version=__version__,
        plugins=[PluginRecord(name=i.name, distribution=i.distribution, version=i.version) for i in engine.pm.describe()],
        environment=collect_environment(),
        stages=[StageRecord(name=s.name, status=s.status, reason=s.reason, duration_s=s.duration_s,
                            cache_key=s.cache_key, detail=s.detail) for s in state.stages.values()],
        artifacts=_artifacts(engine),
        metrics=metrics,
        lossless=Lossless(**state.lossless) if state.lossless else None,
        baseline=Baseline(**state.baseline) if getattr(state, "baseline", None) else None,
        timed_costs=_timed_costs(run_dir),
        oracle=OracleSection(**state.oracle) if getattr(state, "oracle", None) else None,
        peak_rss_mb=peak_rss_mb(),
        error=ErrorRecord(**state.error) if state.error else None,
        started_at=state.started_at,
        duration_s=round(time.perf_counter() - state.t0, 3),
        paths={"run_dir": str(run_dir), "trace": "trace.jsonl", "outputs": "outputs.jsonl"},
    )
    write_report_files(run_dir, report, state.records)
    if engine.options.report_path:
        write_text_atomic(Path(engine.options.report_path), (run_dir / "report.json").read_text())
    return report


def _timed_costs(run_dir: Path) -> list[TimedCosts]:
    """The run's cost grid, if generation wrote one; a report never fails over it."""
    from spdflow.costs import read_grid
    from spdflow.errors import SpdflowError

    try:
        grid = read_grid(run_dir)
    except SpdflowError:
        return []
    return [TimedCosts(batch=b, verify_s=e.verify_s, switch_s=e.switch_s) for b, e in sorted(grid.items())]


def effective_recipe_sha256(recipe) -> str:
    """sha256 of the validated recipe (defaults filled, --set applied) as canonical JSON."""
    return sha256_text(canonical_json(recipe.model_dump(mode="json", by_alias=True)))


def _recipe_sha256(path: Path) -> str | None:
    try:
        return sha256_file(Path(path))
    except OSError:
        return None


def _artifacts(engine) -> list[Artifact]:
    """The run's files with their hashes: trace, outputs, the exported models and programs."""
    run_dir = engine.run_dir
    artifacts = [make_artifact(run_dir, run_dir / name, name) for name in ("trace.jsonl", "outputs.jsonl")
                 if (run_dir / name).is_file()]
    compile_stage = engine.state.stages["compile"]
    qpc_dir = compile_stage.detail.get("qpc_dir") if compile_stage.detail else None
    export_root = engine.export_root()
    if export_root.is_dir():
        for onnx in sorted(export_root.glob("*/*.onnx")):
            artifacts.append(make_artifact(run_dir, onnx, f"{onnx.parent.name.split('-')[0]}.onnx"))
    if qpc_dir and Path(qpc_dir).is_dir():
        for name in ("specializations.json", "custom_io.yaml", "qconfig.json"):
            path = Path(qpc_dir) / name
            if path.is_file():
                artifacts.append(make_artifact(run_dir, path, f"qpc/{name}"))
    return artifacts
