"""Decode-step cost of the onnxruntime backend's two graphs: reference (the exported QAIC graph)
vs fused (``devices.with.graph: fused``: GroupQueryAttention, fused RMSNorms; plugins/spdflow_ort/fused.py).

One export (with compute context lengths when ``--ccl`` is given, as the SmolLM2 recipe has them),
two programs compiled from it, opened in this process with the same threads and spinning (ORT's
pool is process-wide: both sessions run on it). For each K and sequence length (the position of the
step's anchor) the two are timed interleaved round-robin, the order alternating per round; a
cell is the median wall ms of one verify run with the interquartile range, and the ratio
fused / reference. Before timing, both caches are filled by one prefill of random tokens and the
fused graph's first steps are checked against the reference's (same argmax).

    python benchmarks/fused_step.py --model-dir <HF dir> --ctx-len 1024 --ccl 256 512
    python benchmarks/fused_step.py --quick          # embedded model

Prints a markdown table with the 1-minute load average before and after. Exports are cached
under --work-dir (programs inside them).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ccl_step import export  # noqa: E402  (the cached export in a child process)

KS = (0, 7)
PREFILL = 64


def open_program(onnx_path: Path, info: dict, ctx_len: int, ccls, graph: str, threads, spinning: str):
    from spdflow.api import CompileRequest, ModelInfo
    from spdflow.recipe.schema import DevicesSpec
    from spdflow_ort.backend import OrtBackend
    from spdflow_ort.config import OrtConfig
    from spdflow_shapes import specialize

    model_info = ModelInfo(**{**info, "eos_token_ids": tuple(info["eos_token_ids"]),
                              "source_dir": Path(info["source_dir"]), "tokenizer_file": None})
    specs = specialize(list(KS), PREFILL, ctx_len, 1, None, comp_ctx_lengths=ccls)
    config = {"graph": graph, "spinning": spinning}
    if ccls:
        config["comp_ctx_lengths"] = ccls
    program = OrtBackend().compile(CompileRequest(
        onnx_path=onnx_path, export_dir=onnx_path.parent, specializations=specs,
        num_speculative_tokens=list(KS), devices=DevicesSpec(), backend_config=OrtConfig(**config),
        model_info=model_info, role="target", continuous_batching=False))
    return OrtBackend().open_session(program, threads=threads)


def fill(session, tokens: np.ndarray) -> None:
    for start in range(0, len(tokens), PREFILL):
        chunk = tokens[start:start + PREFILL]
        ids = np.ones((1, PREFILL), dtype=np.int64)
        pos = np.full((1, PREFILL), -1, dtype=np.int64)
        ids[0, :len(chunk)] = chunk
        pos[0, :len(chunk)] = np.arange(start, start + len(chunk))
        session.run(ids, pos, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None, help="an HF model directory (default: the embedded target)")
    parser.add_argument("--ctx-len", type=int, default=1024)
    parser.add_argument("--ccl", type=int, nargs="*", default=None, help="compute context lengths of the export")
    parser.add_argument("--lengths", type=int, nargs="*", default=[120, 500, 1000])
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="ORT intra-op threads (default: all cores)")
    parser.add_argument("--spinning", choices=["on", "off"], default="on")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "spdflow-bench-fused")
    args = parser.parse_args(argv)

    from spdflow.zoo import zoo_path

    model_dir = args.model_dir or zoo_path("tinycode-target")
    work = args.work_dir / f"{model_dir.name}-{args.ctx_len}"
    ctx = args.ctx_len
    onnx_path, info = export(model_dir, work, ccl=bool(args.ccl))
    sessions = {graph: open_program(onnx_path, info, ctx, args.ccl or None, graph, args.threads, args.spinning)
                for graph in ("reference", "fused")}
    assert sessions["fused"].graph == "fused"
    lengths = [n for n in args.lengths if n + max(KS) < ctx]
    rng = np.random.default_rng(0)
    vocab = info["vocab_size"]
    prompt = rng.integers(2, vocab, size=max(lengths))
    for session in sessions.values():
        fill(session, prompt)
    # Same argmax on a real cache (positions rewritten by later steps are overwritten anyway).
    for k in KS:
        ids = rng.integers(2, vocab, size=(1, k + 1))
        pos = np.arange(lengths[0] - 1, lengths[0] + k)[None]
        got = {g: s.run(ids, pos, k + 1).copy() for g, s in sessions.items()}
        same = (got["reference"].argmax(-1) == got["fused"].argmax(-1)).all()
        diff = np.abs(got["reference"] - got["fused"]).max()
        print(f"check K={k}: same argmax {bool(same)}, max |logit diff| {diff:.2e}")
    iterations = args.iterations or (5 if args.quick else 30)
    samples = {(g, k, n): [] for g in sessions for k in KS for n in lengths}
    load_before = os.getloadavg()
    started = time.strftime("%H:%M:%S", time.gmtime())
    for iteration in range(iterations + 2):  # 2 warm-up rounds
        for k in KS:
            for n in lengths:
                ids = rng.integers(2, vocab, size=(1, k + 1)).astype(np.int64)
                positions = np.arange(n - 1, n + k, dtype=np.int64)[None]  # anchor at n-1
                order = list(sessions.items())
                for graph, session in (order if iteration % 2 else order[::-1]):
                    wall = time.perf_counter()
                    session.run(ids, positions, k + 1)
                    if iteration >= 2:
                        samples[(graph, k, n)].append((time.perf_counter() - wall) * 1000)
    load_after = os.getloadavg()

    def stats(values):
        q = statistics.quantiles(values, n=4)
        return statistics.median(values), q[0], q[2]

    facts = sessions["fused"].runtime_facts()
    print(f"model {model_dir.name}, ctx_len {ctx}, CCLs {args.ccl}, {iterations} interleaved rounds, threads "
          f"{facts['threads_effective']}, spinning {args.spinning} ({facts['thread_pool']} pool), "
          f"{started} UTC, load before {load_before[0]:.2f} after {load_after[0]:.2f} (1-min averages)")
    print()
    print("| K | seq len | reference ms (IQR) | fused ms (IQR) | fused / reference |")
    print("|---|---|---|---|---|")
    for k in KS:
        for n in lengths:
            r, r1, r3 = stats(samples[("reference", k, n)])
            f, f1, f3 = stats(samples[("fused", k, n)])
            print(f"| {k} | {n} | {r:.2f} ({r1:.1f}–{r3:.1f}) | {f:.2f} ({f1:.1f}–{f3:.1f}) | {f / r:.2f} |")


if __name__ == "__main__":
    main()
