"""The ``ort-genai`` peer: ONNX Runtime GenAI's model builder and greedy generate, in a child.

The builder (``python -m onnxruntime_genai.models.builder -p fp32 -e cpu``) turns the same
Hugging Face directory spdflow exports into GenAI's own graph (fused GroupQueryAttention,
SkipSimplifiedLayerNormalization); the result is cached under the bench's work directory, keyed
by the model directory's content and the onnxruntime-genai version. The config is edited to the
bench's EOS ids and thread count. Batch 1 only.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from spdflow.peer_engines import model_dir_key


def build(model_dir: Path, work_dir: Path, threads: int | None, eos: list[int]) -> Path:
    """GenAI's fp32 CPU model of ``model_dir`` (built once, then reused), set to stop at ``eos``
    (none: the model's own, masked by ``min_length`` in :meth:`Driver._generate`) with ``threads`` intra-op threads."""
    import onnxruntime_genai as og

    out = work_dir / f"ort-genai-{og.__version__}-{model_dir_key(model_dir)}"
    if not (out / "genai_config.json").is_file():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        cache = work_dir / "ort-genai-cache"
        proc = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(model_dir),
                               "-o", str(tmp), "-p", "fp32", "-e", "cpu", "-c", str(cache)],
                              stdout=sys.stderr, stderr=sys.stderr)
        if proc.returncode != 0 or not (tmp / "genai_config.json").is_file():
            raise RuntimeError(f"onnxruntime-genai's model builder failed on '{model_dir}' (exit {proc.returncode})")
        shutil.rmtree(cache, ignore_errors=True)
        shutil.copyfile(tmp / "genai_config.json", tmp / "genai_config.builder.json")
        tmp.replace(out)
    config_path = out / "genai_config.json"  # the builder's, edited afresh for this bench
    config = json.loads((out / "genai_config.builder.json").read_text(encoding="utf-8"))
    options = config["model"]["decoder"].setdefault("session_options", {})
    if threads:
        options["intra_op_num_threads"] = int(threads)
    else:
        options.pop("intra_op_num_threads", None)
    if eos:
        config["model"]["eos_token_id"] = list(eos)
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


class Driver:
    """Greedy generate over the prompts one at a time (``ort_genai_greedy``)."""

    def __init__(self, job: dict):
        import onnxruntime_genai as og

        self.og, self.job = og, job
        self.modes = ["ort_genai_greedy"] if job["batch_size"] == 1 else []
        if not self.modes:
            return
        self.path = build(Path(job["model_dir"]), Path(job["work_dir"]), job.get("threads"), job["eos_token_ids"])
        self.model = og.Model(str(self.path))
        self.engine = f"onnxruntime-genai {og.__version__}"
        self._generate(job["prompts"][0], min(8, job["max_new_tokens"]))  # warm-up, untimed

    def _generate(self, prompt: list[int], max_new: int) -> tuple[list[int], float | None]:
        """New tokens (up to and including the first EOS) and the first token's time."""
        og = self.og
        params = og.GeneratorParams(self.model)
        length = len(prompt) + max_new
        if self.job["eos_token_ids"]:
            params.set_search_options(max_length=length, do_sample=False)
        else:  # EOS ignored: GenAI masks its EOS until min_length
            params.set_search_options(max_length=length, min_length=length, do_sample=False)
        generator = og.Generator(self.model, params)
        generator.append_tokens(prompt)
        eos = set(self.job["eos_token_ids"])
        tokens: list[int] = []
        first = None
        while len(tokens) < max_new and not generator.is_done():
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            tokens.append(token)
            if first is None:
                first = time.perf_counter()
            if token in eos:
                break
        return tokens, first

    def run(self, mode: str) -> dict:
        from spdflow.peers import timed_pass

        max_new = self.job["max_new_tokens"]
        return timed_pass(mode, self.job["prompts"], lambda p: self._generate(p, max_new), self.engine)
