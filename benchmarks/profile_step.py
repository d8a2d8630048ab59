"""Where a decode step's time goes: ONNX Runtime's profiler over one program, by op group.

Exports the model (cached, with and without the ``comp_ctx_lengths`` input), opens one static
session per decode shape exactly as the onnxruntime backend builds them, turns on ORT's
profiler and runs a few hundred steps per (K, sequence length); the per-node kernel times are
summed into groups by the exported node names:

* ``attention``: the score and value MatMuls, Softmax, the mask (Where) and the KV gather
  (``CtxGather``'s GatherND);
* ``kv write``: ``CtxScatter`` (ScatterElements after the backend's lowering);
* ``qkvo proj``, ``mlp``, ``lm head``: the weight MatMuls (``*_proj``, ``/mlp/``, ``lm_head``);
* ``norm``: CustomRMSNorm (SimplifiedLayerNormalization once ORT fuses it);
* ``other``: everything else (RoPE, reshapes, casts ...).

``host`` is the wall time of ``session.run`` minus the kernel time: binding, the executor, Python.

    python benchmarks/profile_step.py                       # embedded model, ctx 1024
    python benchmarks/profile_step.py --model-dir PATH --ctx-len 2048
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from ccl_step import ccl_list, export

GROUPS = ("attention", "kv write", "qkvo proj", "mlp", "lm head", "norm", "other")


def group_of(node: str, op: str) -> str:
    name = node.lower()
    if "ctxscatter" in name or op in ("ScatterElements", "ScatterND"):
        return "kv write"
    if "ctxgather" in name or op in ("GatherND", "Softmax", "Where"):
        return "attention"
    if "rmsnorm" in name or "LayerNormalization" in op:
        return "norm"
    if op in ("MatMul", "FusedMatMul", "Gemm", "MatMulNBits"):
        if "lm_head" in name:
            return "lm head"
        if "/mlp/" in name:
            return "mlp"
        if "proj" in name:
            return "qkvo proj"
        return "attention"
    if "/mlp/" in name:
        return "mlp"
    return "other"


def profile(qpc_dir: Path, spec, positions: np.ndarray, info: dict, steps: int, work: Path) -> tuple[dict, float]:
    """(group -> mean µs per step, mean wall µs per step) of ``steps`` runs of one static shape,
    bound as the backend binds it (KV cache in place, logits into a reused buffer)."""
    import onnxruntime as ort

    from spdflow_ort.backend import spec_file_name
    from spdflow_ort.lowering import lower_custom_ops  # noqa: F401  (the program is already lowered)

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(work / f"profile_{spec.k}_{spec.comp_ctx_lengths}")
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(qpc_dir / "qpc" / spec_file_name(spec)), options,
                                   providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    kv_shape = (1, info["num_kv_heads"], spec.ctx_len, info["head_dim"])
    keep = []
    for value in session.get_inputs():
        if value.name.startswith("past_"):
            kv = ort.OrtValue.ortvalue_from_numpy(np.zeros(kv_shape, dtype=np.float32))
            keep.append(kv)
            binding.bind_ortvalue_input(value.name, kv)
            binding.bind_ortvalue_output(f"{value.name}_RetainedState", kv)
    feeds = {"input_ids": np.full(positions.shape, 5, dtype=np.int64), "position_ids": positions,
             "num_logits_to_keep": np.zeros((spec.num_logits_to_keep, 1), dtype=np.int64)}
    if spec.comp_ctx_lengths is not None:
        feeds["comp_ctx_lengths"] = np.zeros(spec.comp_ctx_lengths, dtype=np.int64)
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    logits = np.zeros((1, spec.num_logits_to_keep, info["vocab_size"]), dtype=np.float32)
    binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
    for _ in range(5):
        session.run_with_iobinding(binding)
    started = time.perf_counter()
    for _ in range(steps):
        session.run_with_iobinding(binding)
    wall = (time.perf_counter() - started) / steps * 1e6
    trace = json.loads(Path(session.end_profiling()).read_text())
    totals: dict[str, float] = defaultdict(float)
    runs = sum(1 for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run")
    for event in trace:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            node = event["name"][: -len("_kernel_time")]
            totals[group_of(node, event.get("args", {}).get("op_name", ""))] += event["dur"]
    return {g: totals[g] / runs for g in GROUPS}, wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--ctx-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=None, help="the anchor position + 1 (default ctx_len/8 - 8)")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "spdflow-bench-ccl")
    args = parser.parse_args(argv)

    from spdflow.api import CompileRequest, ModelInfo
    from spdflow.recipe.schema import DevicesSpec
    from spdflow.zoo import zoo_path
    from spdflow_ort.backend import OrtBackend
    from spdflow_shapes import specialize

    model_dir = args.model_dir or zoo_path("tinycode-target")
    ctx = args.ctx_len
    work = args.work_dir / f"{model_dir.name}-{ctx}"
    ccls = ccl_list(ctx)
    n = args.seq_len or ccls[0] - 8
    rows = []
    for label, ccl in (("full", False), ("ccl", True)):
        onnx_path, info = export(model_dir, work, ccl=ccl)
        model_info = ModelInfo(**{**info, "eos_token_ids": tuple(info["eos_token_ids"]),
                                  "source_dir": Path(info["source_dir"]), "tokenizer_file": None})
        for k in (0, 7):
            positions = np.arange(n - 1, n + k, dtype=np.int64)[None]
            from spdflow.ccl import pick_ccl

            chosen = pick_ccl(positions, ccls) if ccl else None
            specs = [s for s in specialize([k], 32, ctx, 1, None, comp_ctx_lengths=[chosen] if ccl else None)
                     if s.kind == "decode" and s.comp_ctx_lengths == chosen]
            program = OrtBackend().compile(CompileRequest(
                onnx_path=onnx_path, export_dir=onnx_path.parent, specializations=specs,
                num_speculative_tokens=[k], devices=DevicesSpec(), model_info=model_info, role="target",
                continuous_batching=False))
            groups, wall = profile(program.qpc_dir, specs[0], positions, info, args.steps, work)
            rows.append((label, k, chosen or ctx, groups, wall))
    load = os.getloadavg()[0]
    print(f"model {model_dir.name}, ctx_len {ctx}, sequence length {n}, {args.steps} profiled steps per row, "
          f"1 ORT thread, load {load:.2f}; µs per step (share of kernel time)")
    print()
    print("| graph | K | slots read | " + " | ".join(GROUPS) + " | kernels | host | wall |")
    print("|" + "---|" * (len(GROUPS) + 6))
    for label, k, slots, groups, wall in rows:
        kernels = sum(groups.values())
        cells = " | ".join(f"{groups[g]:.0f} ({100 * groups[g] / kernels:.0f}%)" for g in GROUPS)
        print(f"| {label} | {k} | {slots} | {cells} | {kernels:.0f} | {wall - kernels:.0f} | {wall:.0f} |")


if __name__ == "__main__":
    main()
