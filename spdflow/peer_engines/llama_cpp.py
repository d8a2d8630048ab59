"""The ``llama.cpp`` peer: llama-cpp-python on an f32 GGUF written from the same model directory.

Modes (batch 1): ``llama_cpp_greedy`` and ``llama_cpp_prompt_lookup`` (llama-cpp-python's
``LlamaPromptLookupDecoding`` with the recipe's largest K as ``num_pred_tokens`` and its
``prompt_lookup_max`` as ``max_matching_ngram_size``). The GGUF is written by
:mod:`spdflow.peer_engines.gguf_export` once per model directory content and cached under the
bench's work directory.
"""
from __future__ import annotations

import time
from pathlib import Path

from spdflow.peer_engines import model_dir_key


def gguf_for(model_dir: Path, work_dir: Path) -> Path:
    """The cached f32 GGUF of ``model_dir`` (written on first use)."""
    from spdflow.peer_engines.gguf_export import write_gguf

    path = work_dir / f"llama-cpp-{model_dir_key(model_dir)}.f32.gguf"
    if not path.is_file():
        work_dir.mkdir(parents=True, exist_ok=True)
        write_gguf(model_dir, path, "f32")
    return path


class Driver:
    """llama-cpp-python, greedy with and without its prompt-lookup decoding."""

    def __init__(self, job: dict):
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.job = job
        self.modes = ["llama_cpp_greedy", "llama_cpp_prompt_lookup"] if job["batch_size"] == 1 else []
        if not self.modes:
            return
        path = gguf_for(Path(job["model_dir"]), Path(job["work_dir"]))
        longest = max(len(p) for p in job["prompts"]) + job["max_new_tokens"] + job["k"] + 8
        threads = job.get("threads") or None
        kwargs = dict(model_path=str(path), n_ctx=longest, n_batch=512, verbose=False, seed=0)
        if threads:
            kwargs.update(n_threads=threads, n_threads_batch=threads)
        # Two instances, as a user would build them: llama-cpp-python sizes its logits buffer for
        # every position only when ``draft_model`` is given to the constructor (setting it later
        # aborts in the sampler), and that buffer would slow the plain greedy instance's prefill.
        # The weights are mmap'ed, so both share one copy of the file's pages.
        lookup = LlamaPromptLookupDecoding(num_pred_tokens=job["k"], max_ngram_size=job["lookup_ngram"])
        self.llms = {"llama_cpp_greedy": Llama(**kwargs),
                     "llama_cpp_prompt_lookup": Llama(**kwargs, draft_model=lookup)}
        self.engine = f"llama-cpp-python {llama_cpp.__version__} (f32 GGUF)"
        for llm in self.llms.values():  # warm-up, untimed
            self._generate(llm, job["prompts"][0], min(8, job["max_new_tokens"]))

    def _generate(self, llm, prompt: list[int], max_new: int) -> tuple[list[int], float | None]:
        eos = set(self.job["eos_token_ids"])
        tokens: list[int] = []
        first = None
        for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                       reset=True):
            tokens.append(int(token))
            if first is None:
                first = time.perf_counter()
            if len(tokens) >= max_new or token in eos:
                break
        return tokens, first

    def run(self, mode: str) -> dict:
        from spdflow.peers import timed_pass

        llm, max_new = self.llms[mode], self.job["max_new_tokens"]
        return timed_pass(mode, self.job["prompts"], lambda p: self._generate(llm, p, max_new), self.engine)
