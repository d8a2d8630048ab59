"""Fit a roofline device profile (bandwidth, peak, overhead) to a run's measured step costs.

    spdflow run recipes/tinycode_varK.yaml
    spdflow whatif runs/tinycode-varK --batch-size 1,2,4,8 --k-list 0,1,2,3,4,5,6,7 --policy smallest_covering
    python benchmarks/fit_cpu_profile.py runs/tinycode-varK > plugins/spdflow_costs/profiles/cpu-2core-x86.yaml

The second command makes the ``measured`` cost model time every (batch, K) the fit uses and store
them in the run's ``cost_grid.json``; this script reads that file, the run's model shape and
precision, and prints the profile YAML with the fit's median relative error and load.
"""
from __future__ import annotations

import json
import platform
import sys
from pathlib import Path


def main() -> None:
    run_dir = Path(sys.argv[1])
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
    from spdflow_costs.roofline import ModelShape, fit_profile

    grid = json.loads((run_dir / "cost_grid.json").read_text())
    report = json.loads((run_dir / "report.json").read_text())
    ctx_len = report["recipe"]["specialization"]["ctx_len"]
    dtype = report["recipe"]["model"].get("dtype", "float32")
    marker = next((run_dir / "export").glob("target-*/.spdflow-done.json"))
    source = Path(json.loads(marker.read_text())["model_info"]["source_dir"])
    shape = ModelShape.from_config(json.loads((source / "config.json").read_text()), source.name)
    points = {(e["batch"], int(k)): v for e in grid["entries"] for k, v in e["verify_s"].items()}
    bandwidth, peak, overhead, error = fit_profile(shape, points, ctx_len, dtype, dtype)
    loads = sorted({x for e in grid["entries"] for x in e["load"][:1]})
    when = sorted(e["measured_at"] for e in grid["entries"])
    print(f"""# Fitted by benchmarks/fit_cpu_profile.py from measured step costs (cost_grid.json) of
# {shape.name} ({dtype}, ctx_len {ctx_len}) at batch {sorted({b for b, _ in points})}, K {sorted({k for _, k in points})}.
name: cpu-2core-x86
description: "{platform.machine()} CPU, 2 cores, ONNX Runtime backend (the machine this repository is measured on)"
bandwidth_gb_s: {bandwidth:.3g}
peak_tflops: {peak:.3g}
overhead_ms: {overhead:.3g}
weights: {dtype}
kv: {dtype}
includes_host: false   # the replay measures host and proposer time
sources:
  bandwidth_gb_s: "fitted: effective bytes/s of the fit, not the DRAM figure (a small model runs from cache)"
  peak_tflops: "fitted: effective FLOP/s of the fit"
  overhead_ms: "fitted: fixed time per verify run"
  fit: "median |relative error| {error:.1%} over {len(points)} (batch, K) points measured {when[0]}..{when[-1]}, load average {loads[0] if loads else '?'}..{loads[-1] if loads else '?'}"
""")


if __name__ == "__main__":
    main()
