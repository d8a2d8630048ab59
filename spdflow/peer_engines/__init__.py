"""Other engines ``spdflow bench --peers`` runs beside spdflow (each in its own child process).

:mod:`spdflow.peers` starts them and reads their runs; the modules here are the child sides of
the families that need a converted model: ``ort_genai`` (onnxruntime-genai) and ``llama_cpp``
(llama-cpp-python, with :mod:`.gguf_export` writing the GGUF it reads).
"""
from __future__ import annotations

import hashlib
from pathlib import Path


def model_dir_key(model_dir: Path) -> str:
    """A short content hash of a model directory (every file's name and bytes), so a converted
    copy is rebuilt when the weights or config change."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(model_dir).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(model_dir)).encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]
