"""Exporting a large model in a child process (``python -m spdflow_onnx.child``).

Exporting needs torch, transformers and the whole model in memory (one copy of the weights:
export.py writes them one tensor at a time), and a run process that did it would keep that
high-water mark (and torch's libraries) for the rest of its life. So a model whose weights exceed
:data:`CHILD_EXPORT_BYTES` is exported in a child process: the run process never imports torch,
and its peak memory is the backend's. Tiny models export in-process (a child costs seconds of
imports). Progress lines stream through; a StageError comes back as the same one sentence.

No torch at import time: the plugin's hook decides before loading :mod:`spdflow_onnx.export`.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from spdflow.errors import StageError

#: Weights (bytes on disk) above which the export runs in a child process.
CHILD_EXPORT_BYTES = 64 * 1024 * 1024
#: Set to "1" to export every model in a child, "0" never (tests of both paths).
ENV = "SPDFLOW_EXPORT_CHILD"


def weights_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for pattern in ("*.safetensors", "*.bin") for p in Path(model_dir).glob(pattern))


def wants_child(model_dir: Path) -> bool:
    forced = os.environ.get(ENV)
    if forced in ("0", "1"):
        return forced == "1"
    return weights_bytes(model_dir) > CHILD_EXPORT_BYTES


def export_in_child(request):
    """Run :func:`spdflow_onnx.export.export_model` for ``request`` in a child process."""
    from spdflow.api import ExportResult, ModelInfo

    job = {"model": request.model.model_dump(mode="json", by_alias=True), "model_dir": str(request.model_dir),
           "role": request.role, "continuous_batching": request.continuous_batching,
           "work_dir": str(request.work_dir), "outputs": list(request.outputs),
           "ccl": bool(getattr(request, "ccl", False))}
    env = dict(os.environ, **{ENV: "0"})
    proc = subprocess.Popen([sys.executable, "-m", "spdflow_onnx.child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    proc.stdin.write(json.dumps(job))
    proc.stdin.close()
    result = error = None
    for line in proc.stdout:
        kind, _, payload = line.rstrip("\n").partition(" ")
        if kind == "progress":
            request.progress(payload)
        elif kind == "result":
            result = json.loads(payload)
        elif kind == "error":
            error = json.loads(payload)
    stderr = proc.stderr.read()
    proc.wait()
    if error is not None:
        raise StageError(error["message"], hint=error.get("hint"))
    if proc.returncode != 0 or result is None:
        tail = (stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise StageError(f"export: the export process failed: {tail}",
                         hint="rerun with SPDFLOW_EXPORT_CHILD=0 to export in-process and see the traceback")
    # The child's own high-water mark (RUSAGE_CHILDREN would be the largest of every child this
    # process has waited for, e.g. a GGUF conversion's).
    peak = result["peak_rss_mb"]
    request.progress(f"exported in a child process (its peak RSS {peak:,.0f} MiB; this process never loads torch)")
    work = Path(request.work_dir)
    return ExportResult(onnx_path=work / result["onnx"], model_info=ModelInfo.from_json(result["model_info"]),
                        files=[work / name for name in result["files"]])


def _child() -> int:
    from spdflow.api import ExportRequest
    from spdflow.errors import SpdflowError
    from spdflow.recipe.schema import ModelSpec
    from spdflow_onnx.export import export_model

    job = json.loads(sys.stdin.read())

    def say(kind: str, payload: str) -> None:
        print(kind, payload, flush=True)

    request = ExportRequest(model=ModelSpec.model_validate(job["model"]), model_dir=Path(job["model_dir"]),
                            role=job["role"], continuous_batching=job["continuous_batching"],
                            work_dir=Path(job["work_dir"]), progress=lambda m: say("progress", m.replace("\n", " ")),
                            outputs=tuple(job["outputs"]), ccl=job["ccl"])
    try:
        result = export_model(request)
    except SpdflowError as exc:
        say("error", json.dumps({"message": exc.message, "hint": exc.hint}))
        return 3
    work = Path(job["work_dir"])
    say("result", json.dumps({"onnx": result.onnx_path.name, "model_info": result.model_info.to_json(),
                              "files": [str(Path(f).relative_to(work)) for f in result.files],
                              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
