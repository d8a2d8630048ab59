"""ONNX Runtime decode-step latency and memory by session mode.

Measures the median ms of one decode step at seq_len 1, 2, 3, 5, 8 (K = 0, 1, 2, 4, 7) for the
embedded tinycode-target and a ~56M-parameter random Llama, both at ctx_len 512, for four
variants: static sessions or one dynamic session, each with the KV cache bound in place or with
plain ``run()`` feeding the retained state back (copying). Rows are interleaved round-robin in
one process (no torch loaded there) so drift hits every variant alike; peak RSS is measured in a
separate process per variant.

    python benchmarks/ort_step.py            # ~5 minutes on 2 cores
    python benchmarks/ort_step.py --quick    # fewer iterations

Prints a markdown table. Exports and programs are cached under --work-dir.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SEQ_LENS = (1, 2, 3, 5, 8)
CTX = 512
PREFILL = 32
VARIANTS = (
    ("static", True, "static, in-place KV"),
    ("static", False, "static, copying KV"),
    ("dynamic", True, "dynamic, in-place KV"),
    ("dynamic", False, "dynamic, copying KV"),
)


# ----------------------------------------------------------------------------- preparation


def prepare(name: str, work_dir: Path) -> Path:
    """Export (cached) and compile the model; returns the program's ``qpc-<hash>`` dir."""
    from spdflow.api import ExportRequest
    from spdflow.recipe.schema import ModelSpec
    from spdflow.testing.models import make_50m_llama
    from spdflow.zoo import zoo_path
    from spdflow_onnx.export import export_model, load_hf_model, model_info

    root = work_dir / name
    if name == "tinycode-target":
        model_dir = zoo_path(name)
    else:
        model_dir = root / "model"
        if not (model_dir / "config.json").is_file():
            make_50m_llama(model_dir)
    export_dir = root / "export"
    spec = ModelSpec(id=name)
    request = ExportRequest(model=spec, model_dir=model_dir, role="target",
                            continuous_batching=False, work_dir=export_dir)
    if (export_dir / "model.onnx").is_file():
        info = model_info(load_hf_model(model_dir), request)
        onnx_path = export_dir / "model.onnx"
    else:
        export_dir.mkdir(parents=True, exist_ok=True)
        result = export_model(request)
        info, onnx_path = result.model_info, result.onnx_path
    return compile_program(onnx_path, export_dir, info)


def compile_program(onnx_path: Path, export_dir: Path, info) -> Path:
    """The onnxruntime program (prefill + one decode shape per SEQ_LENS) of an export; its dir."""
    from spdflow.api import CompileRequest, Specialization
    from spdflow.recipe.schema import DevicesSpec
    from spdflow_ort.backend import OrtBackend

    specs = [Specialization("prefill", 1, PREFILL, CTX, 1)]
    specs += [Specialization("decode", 1, s, CTX, s, None, s - 1) for s in SEQ_LENS]
    program = OrtBackend().compile(CompileRequest(
        onnx_path=onnx_path, export_dir=export_dir, specializations=specs,
        num_speculative_tokens=[s - 1 for s in SEQ_LENS], devices=DevicesSpec(),
        model_info=info, role="target", continuous_batching=False,
    ))
    return program.qpc_dir


# ----------------------------------------------------------------------------- workers (no torch)


def open_variant(qpc_dir: Path, mode: str, in_place: bool):
    """An OrtSession on the program, as the backend would open it, plus a filled-in KV cache."""
    from spdflow.api import Specialization
    from spdflow_ort.session import OrtSession

    manifest = json.loads((qpc_dir / "qpc" / "manifest.json").read_text())
    qconfig = json.loads((qpc_dir / "qconfig.json").read_text())
    specs = []
    for graph in manifest["graphs"]:
        sym = graph["symbols"]
        specs.append(Specialization(graph["kind"], sym["batch_size"], sym["seq_len"], sym["ctx_len"],
                                    sym["num_logits_to_keep"], sym.get("full_batch_size"), graph["k"]))
    session = OrtSession(qpc_dir / "qpc", specializations=specs,
                         vocab_size=qconfig["model"]["vocab_size"], mode=mode, in_place=in_place)
    vocab = qconfig["model"]["vocab_size"]
    rng = np.random.default_rng(0)
    for start in (0, PREFILL, 2 * PREFILL):  # 96 real positions in the cache
        ids = rng.integers(2, vocab, size=(1, PREFILL))
        session.run(ids, np.arange(start, start + PREFILL)[None], 1)
    return session, vocab


def step_inputs(seq_len: int, vocab: int):
    rng = np.random.default_rng(seq_len)
    ids = rng.integers(2, vocab, size=(1, seq_len)).astype(np.int64)
    positions = np.arange(100, 100 + seq_len, dtype=np.int64)[None]
    return ids, positions


def time_worker(qpc_dir: Path, iterations: int, warmup: int) -> dict:
    """Median ms per (variant, seq_len), every variant's sessions open, interleaved round-robin."""
    sessions = {label: open_variant(qpc_dir, mode, in_place) for mode, in_place, label in VARIANTS}
    inputs = {s: step_inputs(s, next(iter(sessions.values()))[1]) for s in SEQ_LENS}
    samples: dict[str, dict[int, list[float]]] = {label: {s: [] for s in SEQ_LENS} for label in sessions}
    for iteration in range(warmup + iterations):
        for label, (session, _) in sessions.items():
            for s in SEQ_LENS:
                ids, positions = inputs[s]
                started = time.perf_counter()
                session.run(ids, positions, s)
                elapsed = (time.perf_counter() - started) * 1000
                if iteration >= warmup:
                    samples[label][s].append(elapsed)
    return {label: {str(s): statistics.median(v) for s, v in rows.items()} for label, rows in samples.items()}


def _vm_hwm_mb() -> float:
    # VmHWM is per address space and starts fresh at exec; ru_maxrss would carry over the
    # parent's peak (which loaded torch and the HF model).
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_worker(qpc_dir: Path, mode: str, in_place: bool) -> dict:
    """Peak RSS (MB) of this process after opening one variant and running every shape."""
    import onnxruntime  # noqa: F401  (counted in the base)

    base = _vm_hwm_mb()
    session, vocab = open_variant(qpc_dir, mode, in_place)
    for _ in range(3):
        for s in SEQ_LENS:
            session.run(*step_inputs(s, vocab), s)
    return {"peak_mb": _vm_hwm_mb(), "base_mb": base}


def run_worker(args: list[str]) -> dict:
    """Run this script as a worker subprocess and parse its JSON line."""
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"worker {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- report


def render(results: dict[str, dict]) -> str:
    head = "| model | variant | " + " | ".join(f"s={s}" for s in SEQ_LENS) + " | peak RSS MB | over base MB |"
    lines = [head, "|" + "---|" * (len(SEQ_LENS) + 4)]
    for model, result in results.items():
        for _, _, label in VARIANTS:
            times = result["times"][label]
            cells = " | ".join(f"{times[str(s)]:.2f}" for s in SEQ_LENS)
            peak, extra = result["rss"][label]
            lines.append(f"| {model} | {label} | {cells} | {peak:.0f} | {extra:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (noisier)")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "spdflow-bench-ort")
    parser.add_argument("--models", default="tinycode-target,llama-56m")
    parser.add_argument("--worker", choices=["time", "rss"], help=argparse.SUPPRESS)
    parser.add_argument("--qpc", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--copy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=None, help="timed steps per cell")
    args = parser.parse_args(argv)

    if args.worker == "time":
        print(json.dumps(time_worker(args.qpc, args.iterations, warmup=3)))
        return
    if args.worker == "rss":
        print(json.dumps(rss_worker(args.qpc, args.mode, not args.copy)))
        return

    iterations = args.iterations or (10 if args.quick else 60)
    results = {}
    for name in args.models.split(","):
        print(f"[{name}] export + compile", file=sys.stderr)
        qpc = prepare(name, args.work_dir)
        print(f"[{name}] timing ({iterations} iterations per cell)", file=sys.stderr)
        times = run_worker(["--worker", "time", "--qpc", str(qpc), "--iterations", str(iterations)])
        rss = {}
        for mode, in_place, label in VARIANTS:
            extra = [] if in_place else ["--copy"]
            measured = run_worker(["--worker", "rss", "--qpc", str(qpc), "--mode", mode, *extra])
            rss[label] = (measured["peak_mb"], measured["peak_mb"] - measured["base_mb"])
        results[name] = {"times": times, "rss": rss}
    import onnxruntime

    print(f"ORT {onnxruntime.__version__}, {os.cpu_count()} cores, ctx_len {CTX}, batch 1, "
          f"median ms per step over {iterations} interleaved iterations; peak RSS per variant "
          "in its own process; 'over base' excludes Python + numpy + onnxruntime\n")
    print(render(results))


if __name__ == "__main__":
    main()
