"""ONNX Runtime decode-step cost of the QEfficient custom-op export against an older export.

The current exporter writes the KV cache through ``CtxScatter``/``CtxGather`` and normalises
with ``CustomRMSNorm`` (ONNX local functions); the baseline is the exporter of a git revision
(default: d0e7382, the last one with plain ScatterElements and RMSNorm ops). Both graphs are
compiled by the onnxruntime backend and timed with the engine's session (static shapes, KV
bound in place) in one process, interleaved A B A B per step, batch 1, ctx_len 512.

    python benchmarks/kv_ops.py                       # ~3 minutes on 2 cores
    python benchmarks/kv_ops.py --baseline <rev> --models tinycode-target --iterations 200

Prints the machine load before and after and a markdown table: median ms per step, its
interquartile range, and current / baseline.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ort_step import CTX, SEQ_LENS, compile_program, open_variant, step_inputs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("baseline", "current")


def _baseline_exporter(rev: str, work_dir: Path):
    """The export module of ``rev``, loaded from ``git show`` under another name."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:plugins/spdflow_onnx/export.py"],
                            capture_output=True, text=True, check=True).stdout
    path = work_dir / f"export_{rev}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"baseline_export_{rev}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare(name: str, variant: str, rev: str, work_dir: Path) -> Path:
    """Export ``name`` with the variant's exporter (cached) and compile it; the qpc dir."""
    from spdflow.api import ExportRequest
    from spdflow.recipe.schema import ModelSpec
    from spdflow.testing.models import make_50m_llama
    from spdflow.zoo import zoo_path

    if variant == "current":
        import spdflow_onnx.export as exporter
    else:
        exporter = _baseline_exporter(rev, work_dir)
    root = work_dir / name
    model_dir = zoo_path(name) if name == "tinycode-target" else root / "model"
    if name != "tinycode-target" and not (model_dir / "config.json").is_file():
        make_50m_llama(model_dir)
    export_dir = root / (variant if variant == "current" else f"baseline-{rev}")
    request = ExportRequest(model=ModelSpec(id=name), model_dir=model_dir, role="target",
                            continuous_batching=False, work_dir=export_dir)
    if (export_dir / "model.onnx").is_file() and variant != "current":
        info = exporter.model_info(exporter.load_hf_model(model_dir), request)
        onnx_path = export_dir / "model.onnx"
    else:
        shutil.rmtree(export_dir, ignore_errors=True)  # the current exporter may have changed
        export_dir.mkdir(parents=True)
        result = exporter.export_model(request)
        info, onnx_path = result.model_info, result.onnx_path
    return compile_program(onnx_path, export_dir, info)


def time_worker(programs: dict[str, Path], iterations: int, warmup: int = 5) -> dict:
    """ms samples per (variant, seq_len), both programs open, interleaved A B A B."""
    sessions = {v: open_variant(qpc, "static", True) for v, qpc in programs.items()}
    vocab = next(iter(sessions.values()))[1]
    inputs = {s: step_inputs(s, vocab) for s in SEQ_LENS}
    samples = {v: {s: [] for s in SEQ_LENS} for v in sessions}
    for iteration in range(warmup + iterations):
        for s in SEQ_LENS:
            order = VARIANTS if iteration % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                session = sessions[variant][0]
                started = time.perf_counter()
                session.run(*inputs[s], s)
                if iteration >= warmup:
                    samples[variant][s].append((time.perf_counter() - started) * 1000)
    return {v: {str(s): values for s, values in rows.items()} for v, rows in samples.items()}


def run_worker(args: list[str]) -> dict:
    """This script as a worker subprocess (no torch loaded there); its JSON line."""
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"worker {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4)
    return q1, median, q3


def render(results: dict[str, dict]) -> str:
    lines = ["| model | seq_len (K+1) | baseline ms (IQR) | current ms (IQR) | current / baseline |",
             "|---|---|---|---|---|"]
    for model, times in results.items():
        for s in SEQ_LENS:
            cells = []
            for variant in VARIANTS:
                q1, median, q3 = _quartiles(times[variant][str(s)])
                cells.append((median, f"{median:.3f} ({q1:.3f}–{q3:.3f})"))
            ratio = cells[1][0] / cells[0][0]
            lines.append(f"| {model} | {s} | {cells[0][1]} | {cells[1][1]} | {ratio:.3f} |")
    return "\n".join(lines)


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="d0e7382", help="git revision of the baseline exporter")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "spdflow-bench-kv-ops")
    parser.add_argument("--models", default="tinycode-target,llama-56m")
    parser.add_argument("--iterations", type=int, default=100, help="timed steps per cell and variant")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        programs = json.loads(args.worker.read_text())
        print(json.dumps(time_worker({v: Path(p) for v, p in programs.items()}, args.iterations)))
        return

    args.work_dir.mkdir(parents=True, exist_ok=True)
    results, loads = {}, [_load()]
    for name in args.models.split(","):
        print(f"[{name}] export + compile", file=sys.stderr)
        programs = {v: str(prepare(name, v, args.baseline, args.work_dir)) for v in VARIANTS}
        spec = args.work_dir / f"{name}.programs.json"
        spec.write_text(json.dumps(programs))
        print(f"[{name}] timing", file=sys.stderr)
        results[name] = run_worker(["--worker", str(spec), "--iterations", str(args.iterations)])
    loads.append(_load())
    import onnxruntime

    print(f"ORT {onnxruntime.__version__}, {os.cpu_count()} cores, ctx_len {CTX}, batch 1, static "
          f"sessions with the KV bound in place, {args.iterations} interleaved steps per cell; "
          f"baseline exporter {args.baseline}\nload before: {loads[0]}\nload after:  {loads[1]}\n")
    print(render(results))


if __name__ == "__main__":
    main()
