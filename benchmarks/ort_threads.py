"""ONNX Runtime thread pools on a compiled program: spinning or not, shared or per session, 1 or 2 threads.

Each configuration runs in its own child process (ORT's process-wide pool can be made only once
per process), the configurations in rotated order for several rounds; a child opens one session
on the program's dynamic graph (``model.onnx``), binds the KV cache in place as the backend does,
and times decode steps of ``seq_len = K + 1`` tokens with a little host work between them (an
argmax, as a generation loop has). Prints the median step ms and interquartile range per
configuration and the ratio to the first one, with the load average of each round.

    python benchmarks/ort_threads.py runs/smollm2-chat-varK/export/target-*/qpc-*/qpc --k 0,7

Configurations (``--configs``), ``pool:threads:spin``: ``global:2:1`` is ORT's process-wide pool
(spdflow's ``spinning: on``), ``session:2:0`` a pool per session whose threads sleep
(``spinning: off``); ``global:T:0`` keeps the shared pool but stops its spinning after each run
(``session.force_spinning_stop``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_CONFIGS = "global:2:1,session:2:0,session:2:1,session:1:0,global:1:1"


def child(program: Path, config: str, seq: int, steps: int, ctx: int) -> list[float]:
    """Step times (ms) of one configuration; runs in the child process."""
    import numpy as np
    import onnxruntime as ort

    pool, threads, spin = config.split(":")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if pool == "global":
        ort.set_global_thread_pool_sizes(int(threads), 1)
        options.use_per_session_threads = False
        if spin == "0":
            options.add_session_config_entry("session.force_spinning_stop", "1")
    else:
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    session = ort.InferenceSession(str(program / "model.onnx"), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    kv_names = [n for n in inputs if n.startswith("past_")]
    heads, head_dim = inputs[kv_names[0]].shape[1], inputs[kv_names[0]].shape[3]
    kv = {n: ort.OrtValue.ortvalue_from_numpy(np.zeros((1, heads, ctx, head_dim), np.float32)) for n in kv_names}
    binding = session.io_binding()
    for name in kv_names:
        binding.bind_ortvalue_input(name, kv[name])
        binding.bind_ortvalue_output(f"{name}_RetainedState", kv[name])
    vocab = session.get_outputs()[0].shape[-1]
    logits = np.zeros((1, seq, vocab), np.float32)
    binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
    keep = np.zeros((seq, 1), np.int64)
    times = []
    for step in range(steps + 5):  # 5 warm-up steps
        position = ctx // 4 + step
        binding.bind_cpu_input("input_ids", np.full((1, seq), 100 + step, np.int64))
        binding.bind_cpu_input("position_ids", np.arange(position, position + seq, dtype=np.int64)[None])
        binding.bind_cpu_input("num_logits_to_keep", keep)
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        times.append((time.perf_counter() - start) * 1000)
        logits.argmax(-1)
    return times[5:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", type=Path, help="a compiled onnxruntime program's qpc/ directory")
    parser.add_argument("--k", default="0", help="comma-separated K values (seq_len = K + 1)")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--ctx-len", type=int, default=None, help="default: the program's specializations")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ctx = args.ctx_len or json.loads((args.program / "manifest.json").read_text())["graphs"][0]["symbols"]["ctx_len"]
    if args.child:
        config, seq = args.child.rsplit("@", 1)
        print(json.dumps(child(args.program, config, int(seq), args.steps, ctx)))
        return
    configs = args.configs.split(",")
    samples: dict[tuple[int, str], list[float]] = {}
    loads: list[float] = []
    for round_ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        order = configs[round_ % len(configs):] + configs[:round_ % len(configs)]
        for k in (int(x) for x in args.k.split(",")):
            for config in order:
                out = subprocess.run([sys.executable, __file__, str(args.program), "--child", f"{config}@{k + 1}",
                                      "--steps", str(args.steps), "--ctx-len", str(ctx)],
                                     capture_output=True, text=True, check=True)
                samples.setdefault((k, config), []).extend(json.loads(out.stdout.strip().splitlines()[-1]))
    loads.append(os.getloadavg()[0])
    print(f"program {args.program}, ctx_len {ctx}, {args.rounds} rounds x {args.steps} steps, "
          f"load (1-min) per round {', '.join(f'{x:.2f}' for x in loads)}")
    print()
    print("| K | pool:threads:spin | median ms | IQR ms | / first |")
    print("|---|---|---|---|---|")
    for k in sorted({k for k, _ in samples}):
        first = statistics.median(samples[(k, configs[0])])
        for config in configs:
            values = samples[(k, config)]
            q = statistics.quantiles(values, n=4)
            median = statistics.median(values)
            print(f"| {k} | {config} | {median:.1f} | {q[0]:.1f}–{q[2]:.1f} | {median / first:.2f} |")


if __name__ == "__main__":
    main()
