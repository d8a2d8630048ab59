"""Decode-step cost vs sequence length, with and without compute context lengths (CCL).

One process (torch only for the export, in a child), ONNX Runtime static sessions as the backend
opens them (one shared thread pool). Two programs of the same model: the default graph (every
step reads all ctx_len cache slots) and the CCL graph compiled with ``comp_ctx_lengths`` (each
step runs the smallest CCL that holds its last position, as the runtime picks it). For each K
and each sequence length (the position of the step's anchor) the two are timed interleaved
round-robin; a cell is the median ms of one verify run, with the interquartile range and the
ratio CCL / full, in CPU time of this process (``time.process_time``: on a shared, loaded machine
wall time mostly measures the scheduler; with one ORT thread the kernels run in this process)
and in wall time.

    python benchmarks/ccl_step.py                                     # embedded model, ctx 1024
    python benchmarks/ccl_step.py --model-dir PATH --ctx-len 2048     # a real HF model directory
    python benchmarks/ccl_step.py --quick

Prints a markdown table and the load average before and after. Exports and programs are cached
under --work-dir.
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

KS = (0, 3, 7)
#: intra-op threads of every session (--threads); 1 keeps a busy shared machine from stretching
#: each step by thread hand-offs
THREADS = 1


def ccl_list(ctx_len: int) -> list[int]:
    """ctx_len/8, /4, /2 and ctx_len."""
    return [ctx_len // 8, ctx_len // 4, ctx_len // 2, ctx_len]


def export(model_dir: Path, work: Path, ccl: bool) -> tuple[Path, dict]:
    """Export (cached) in a child process; returns the ONNX path and the model info."""
    out = work / ("export-ccl" if ccl else "export-full")
    if not (out / "model.onnx").is_file():
        code = (
            "import sys, json; from pathlib import Path\n"
            "from spdflow.api import ExportRequest\nfrom spdflow.recipe.schema import ModelSpec\n"
            "from spdflow_onnx.export import export_model\n"
            f"out = Path({str(out)!r}); out.mkdir(parents=True, exist_ok=True)\n"
            f"r = export_model(ExportRequest(model=ModelSpec(id='m'), model_dir=Path({str(model_dir)!r}), "
            f"role='target', continuous_batching=False, work_dir=out, ccl={ccl}))\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True)
    return out / "model.onnx", json.loads((out / "model_info.json").read_text())


def compile_program(onnx_path: Path, info: dict, ctx_len: int, ccls: list[int] | None):
    from spdflow.api import CompileRequest, ModelInfo
    from spdflow.recipe.schema import DevicesSpec
    from spdflow_ort.backend import OrtBackend
    from spdflow_shapes import specialize

    model_info = ModelInfo(**{**info, "eos_token_ids": tuple(info["eos_token_ids"]),
                              "source_dir": Path(info["source_dir"]), "tokenizer_file": None})
    specs = [s for s in specialize(list(KS), 32, ctx_len, 1, None, comp_ctx_lengths=ccls) if s.kind == "decode"]
    program = OrtBackend().compile(CompileRequest(
        onnx_path=onnx_path, export_dir=onnx_path.parent, specializations=specs,
        num_speculative_tokens=list(KS), devices=DevicesSpec(), model_info=model_info, role="target",
        continuous_batching=False))
    return OrtBackend().open_session(program, threads=THREADS)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None, help="an HF model directory (default: the embedded target)")
    parser.add_argument("--ctx-len", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads (default 1)")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "spdflow-bench-ccl")
    args = parser.parse_args(argv)

    from spdflow.zoo import zoo_path

    global THREADS
    THREADS = args.threads
    model_dir = args.model_dir or zoo_path("tinycode-target")
    work = args.work_dir / f"{model_dir.name}-{args.ctx_len}"
    ctx = args.ctx_len
    ccls = ccl_list(ctx)
    full_onnx, info = export(model_dir, work, ccl=False)
    ccl_onnx, _ = export(model_dir, work, ccl=True)
    sessions = {"full": compile_program(full_onnx, info, ctx, None), "ccl": compile_program(ccl_onnx, info, ctx, ccls)}
    # Sequence lengths: just inside each CCL (the best case) and just past it (the worst).
    lengths = sorted({c - 8 for c in ccls} | {c + 8 for c in ccls[:-1]})
    iterations = args.iterations or (5 if args.quick else 25)
    rng = np.random.default_rng(0)
    vocab = info["vocab_size"]
    samples = {(name, k, n): [] for name in sessions for k in KS for n in lengths}
    walls = {key: [] for key in samples}
    load_before = os.getloadavg()
    for iteration in range(iterations + 2):  # 2 warm-up rounds
        for k in KS:
            for n in lengths:
                ids = rng.integers(2, vocab, size=(1, k + 1)).astype(np.int64)
                positions = np.arange(n - 1, n + k, dtype=np.int64)[None]  # anchor at n-1
                order = list(sessions.items())
                for name, session in (order if iteration % 2 else order[::-1]):  # alternate who goes first
                    cpu, wall = time.process_time(), time.perf_counter()
                    session.run(ids, positions, k + 1)
                    if iteration >= 2:
                        samples[(name, k, n)].append((time.process_time() - cpu) * 1000)
                        walls[(name, k, n)].append((time.perf_counter() - wall) * 1000)
    load_after = os.getloadavg()

    def stats(values):
        q = statistics.quantiles(values, n=4)
        return statistics.median(values), q[2] - q[0]

    print(f"model {model_dir.name}, ctx_len {ctx}, CCLs {ccls}, {iterations} interleaved rounds, "
          f"ORT threads {THREADS}, load before {load_before[0]:.2f} "
          f"after {load_after[0]:.2f} (1-min averages)")
    print()
    print("| K | seq len | CCL run | full CPU ms (IQR) | CCL CPU ms (IQR) | CCL / full CPU | CCL / full wall |")
    print("|---|---|---|---|---|---|---|")
    for k in KS:
        for n in lengths:
            from spdflow.ccl import pick_ccl

            used = pick_ccl(np.arange(n - 1, n + k)[None], ccls)
            f, fi = stats(samples[("full", k, n)])
            c, ci = stats(samples[("ccl", k, n)])
            wf, wc = statistics.median(walls[("full", k, n)]), statistics.median(walls[("ccl", k, n)])
            print(f"| {k} | {n} | {used} | {f:.2f} ({fi:.2f}) | {c:.2f} ({ci:.2f}) | {c / f:.2f} | {wc / wf:.2f} |")


if __name__ == "__main__":
    main()
