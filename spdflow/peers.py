"""Peers for ``spdflow bench --peers``: other engines on the same prompts and model, their
runs interleaved with spdflow's modes.

Every peer is greedy, with the same ``max_new_tokens`` and EOS rule (stop after the first EOS,
which is kept), and gets token ids directly (no re-tokenization). Families, each an optional
install that is skipped with one line when absent:

* ``hf`` (transformers): ``hf_greedy`` (``generate``, any batch size, left padding),
  ``hf_prompt_lookup`` (``prompt_lookup_num_tokens`` = the largest K, ``max_matching_ngram_size``
  = the recipe's ``prompt_lookup_max``; batch 1, as HF runs it) and ``hf_assisted`` (the recipe's
  draft model; batch 1);
* ``ort-genai`` (onnxruntime-genai, :mod:`spdflow.peer_engines.ort_genai`): its model builder's
  fp32 CPU graph of the same model directory, greedy (``ort_genai_greedy``, batch 1);
* ``llama.cpp`` (llama-cpp-python, :mod:`spdflow.peer_engines.llama_cpp`): an f32 GGUF written
  from the same model directory, greedy (``llama_cpp_greedy``) and with its prompt-lookup decoding
  (``llama_cpp_prompt_lookup``), batch 1.

Each family runs in its own child process (``python -m spdflow.peers FAMILY``), kept alive for a
batch size so that the bench can interleave its runs with spdflow's: torch's OpenMP pool and
other engines' thread pools would distort the ORT timings if they shared the process
(research/feasibility.md §4).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any



# ------------------------------------------------------------------------------ parent side


def peer_job(loaded, recipe, info, requests, batch_size: int, repeats: int) -> dict[str, Any]:
    """The JSON job the child runs: model dirs, prompt ids, generation settings, which peers."""
    from spdflow.api import PeerEquivalent, peer_equivalent
    from spdflow.models import locate_model, prepare_model_dir

    located = locate_model(recipe.model.id, loaded.base_dir, recipe.model.revision,
                           allow_outside=loaded.allow_outside_paths)
    model_dir, _ = prepare_model_dir(located, recipe.model.dtype, recipe.output_dir())  # the run's own conversion
    # what the recipe's proposer says other engines can run of it
    same = peer_equivalent(loaded.proposer_config) if recipe.proposer is not None else PeerEquivalent()
    modes = ["hf_greedy"]
    draft_dir = None
    if batch_size == 1 and same.lookup_ngram:
        modes.append("hf_prompt_lookup")
    if batch_size == 1 and same.assistant_model:
        draft_dir = str(prepare_model_dir(locate_model(same.assistant_model, loaded.base_dir, key="proposer.with.model",
                                                       allow_outside=loaded.allow_outside_paths),
                                          recipe.model.dtype, recipe.output_dir())[0])
        modes.append("hf_assisted")
    return {
        "model_dir": str(model_dir), "draft_dir": draft_dir, "modes": modes,
        "prompts": [r.prompt_ids.tolist() for r in requests], "max_new_tokens": recipe.workload.max_new_tokens,
        "eos_token_ids": [] if recipe.workload.ignore_eos else list(info.eos_token_ids),
        "pad_token_id": info.pad_token_id, "batch_size": batch_size, "repeats": repeats,
        "k": max(recipe.k_list()), "lookup_ngram": same.lookup_ngram or 2,
        "threads": recipe.devices.with_.get("threads"),  # the backend's thread count, when it has one
    }


FAMILIES: dict[str, tuple[str, str]] = {
    # family: (module whose absence skips it, "module:Driver" the child runs)
    "hf": ("transformers", "spdflow.peers:HFDriver"),
    "ort-genai": ("onnxruntime_genai", "spdflow.peer_engines.ort_genai:Driver"),
    "llama.cpp": ("llama_cpp", "spdflow.peer_engines.llama_cpp:Driver"),
}
INSTALL = {
    "hf": "pip install transformers",
    "ort-genai": 'pip install -e ".[ortgenai]"',
    "llama.cpp": 'pip install -e ".[llamacpp]" (compiles llama.cpp: several minutes)',
}


def missing_reason(family: str) -> str | None:
    """Why a peer family cannot run here (its package is not installed), or None."""
    import importlib.util

    module = FAMILIES[family][0]
    if importlib.util.find_spec(module) is None:
        return f"peer '{family}' skipped: {module} is not installed ({INSTALL[family]})"
    return None


class PeerProcess:
    """One peer family in its own child process, kept alive for the whole batch size so its
    runs interleave with spdflow's modes (``python -m spdflow.peers FAMILY``).

    Protocol: the job as the first line on the child's stdin; the child prepares (converts,
    loads, warms up) and answers ``{"modes": [...]}``; then each ``{"run": MODE}`` line gets one
    JSON line back (a run, or ``{"error": ...}``); end of input ends the child.
    """

    def __init__(self, family: str, job: dict):
        import tempfile

        self.family = family
        self.stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen([sys.executable, "-m", "spdflow.peers", family], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)
        self._send(job)
        self.modes: list[str] = list(self._read().get("modes", []))
        self.note: str | None = None

    def _send(self, message: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def _read(self) -> dict:
        from spdflow.errors import StageError

        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        reply = json.loads(line) if line.strip() else None
        if reply is None or "error" in reply:
            self.stderr.seek(0)
            tail = [t for t in self.stderr.read().strip().splitlines() if t.strip()][-1:] or ["no output"]
            reason = reply["error"] if reply else tail[0]
            self.close()
            raise StageError(f"the {self.family} peer failed: {reason}",
                             hint=f"its last words: {tail[0]}" if reply else None)
        return reply

    def run(self, mode: str) -> dict:
        self._send({"run": mode})
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def start_peers(families: list[str], loaded, recipe, info, requests, batch_size: int, repeats: int,
                work_dir: Path, progress) -> list[PeerProcess]:
    """A started :class:`PeerProcess` per family that can run here (a line for each skipped)."""
    if recipe.workload.temperature != 0:
        progress("peers skipped: they are greedy only and this workload samples")
        return []
    available = []
    for family in families:
        reason = missing_reason(family)
        if reason:
            progress(reason)
        else:
            available.append(family)
    if not available:
        return []
    job = peer_job(loaded, recipe, info, requests, batch_size, repeats)
    job["work_dir"] = str(work_dir)
    started: list[PeerProcess] = []
    try:
        for family in available:
            progress(f"batch {batch_size}: preparing peer {family} (child process)")
            peer = PeerProcess(family, dict(job, family=family))
            if not peer.modes:
                progress(f"peer '{family}' has no mode at batch {batch_size} (its modes run at batch 1)")
                peer.close()
                continue
            started.append(peer)
    except BaseException:
        for peer in started:
            peer.close()
        raise
    return started


def first_divergence(tokens: dict[int, list[int]], reference: dict[int, list[int]]) -> dict | None:
    """Where a peer's tokens first differ from spdflow's no-spec: request, position (0 = the first
    generated token), both tokens (None past the end of one of them), and how many requests differ."""
    differing = [i for i in sorted(reference) if tokens.get(i) != reference[i]]
    if not differing:
        return None
    request = differing[0]
    mine, theirs = reference[request], tokens.get(request, [])
    position = next((j for j, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine), len(theirs)))
    return {"request": request, "position": position,
            "spdflow": mine[position] if position < len(mine) else None,
            "peer": theirs[position] if position < len(theirs) else None,
            "requests_differing": len(differing), "requests": len(reference)}


def peer_rows(runs: list[dict], batch_size: int, reference: dict[int, list[int]] | None) -> list[dict]:
    """Median/min/max over a peer's repeats, and whether its tokens equal spdflow's no-spec
    (with the first divergence when they do not)."""
    from spdflow.bench import PEER, _stats

    by_mode: dict[str, list[dict]] = {}
    for run in runs:
        by_mode.setdefault(run["mode"], []).append(run)
    rows = []
    for mode, mine in by_mode.items():
        row: dict[str, Any] = {"mode": mode, "batch_size": mine[0].get("batch_size", batch_size), "repeats": len(mine),
                               "role": PEER}
        for key in ("requests_per_s", "tokens_per_s", "tpot_ms", "peak_rss_mb"):
            row[key], row[f"{key}_min"], row[f"{key}_max"] = _stats([r.get(key) for r in mine])
        row["al"] = None
        tokens = [{int(k): v for k, v in r["tokens"].items()} for r in mine]
        row["identical_to_nospec"] = None if reference is None else all(t == reference for t in tokens)
        if reference is not None and not row["identical_to_nospec"]:
            row["divergence"] = first_divergence(tokens[0], reference)
        row["generated_tokens"] = mine[0]["generated_tokens"]
        if mine[0].get("engine"):
            row["engine"] = mine[0]["engine"]
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ child side


def _clip(tokens: list[int], eos: set[int]) -> list[int]:
    """Tokens up to and including the first EOS (what spdflow keeps)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


class _FirstTokenClock:
    """A generate() streamer that notes when the first generated token arrives (batch 1)."""

    def __init__(self):
        self.calls = 0
        self.first = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:  # call 1 is the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def _generate(model, prompts: list[list[int]], job: dict, mode: str, assistant=None) -> tuple[list[list[int]], float, list]:
    """Greedy generate for a group of prompts; (new tokens per prompt, seconds, tpot values)."""
    import torch
    from transformers import GenerationConfig

    eos = job["eos_token_ids"]
    config = GenerationConfig(do_sample=False, max_new_tokens=job["max_new_tokens"], pad_token_id=job["pad_token_id"],
                              eos_token_id=eos or None, bos_token_id=None)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), job["pad_token_id"], dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):  # left padding
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    kwargs: dict[str, Any] = {}
    if mode == "hf_prompt_lookup":
        kwargs.update(prompt_lookup_num_tokens=job["k"], max_matching_ngram_size=job["lookup_ngram"])
    elif mode == "hf_assisted":
        kwargs.update(assistant_model=assistant)
        assistant.generation_config.num_assistant_tokens = job["k"]
    clock = _FirstTokenClock() if len(prompts) == 1 else None
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, streamer=clock, **kwargs)
    end = time.perf_counter()
    new = [_clip(out[row, width:].tolist(), set(eos)) for row in range(len(prompts))]
    tpots = []
    if clock is not None and clock.first is not None and len(new[0]) > 1:
        tpots.append((end - clock.first) / (len(new[0]) - 1))
    return new, end - start, tpots


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_peer(model, job: dict, mode: str, assistant=None) -> dict:
    """One timed pass of one HF peer over every prompt, in groups of the batch size."""
    prompts, b = job["prompts"], job["batch_size"] if mode == "hf_greedy" else 1
    tokens: dict[int, list[int]] = {}
    seconds, tpots = 0.0, []
    for start in range(0, len(prompts), b):
        group = prompts[start:start + b]
        new, elapsed, group_tpots = _generate(model, group, job, mode, assistant)
        seconds += elapsed
        tpots += group_tpots
        for offset, t in enumerate(new):
            tokens[start + offset] = t
    return pass_result(mode, b, tokens, seconds, tpots)


def pass_result(mode: str, batch_size: int, tokens: dict[int, list[int]], seconds: float, tpots: list[float],
                engine: str | None = None) -> dict:
    """One peer pass as the parent reads it (every family returns this shape)."""
    generated = sum(len(t) for t in tokens.values())
    return {"mode": mode, "batch_size": batch_size, "requests_per_s": len(tokens) / seconds,
            "tokens_per_s": generated / seconds, "tpot_ms": statistics.median(tpots) * 1000 if tpots else None,
            "generated_tokens": generated, "peak_rss_mb": round(_peak_rss_mb(), 1), "tokens": tokens,
            "engine": engine}


def timed_pass(mode: str, prompts: list[list[int]], generate, engine: str) -> dict:
    """One batch-1 pass over ``prompts``: ``generate(prompt)`` returns (new tokens, the time the
    first one arrived); seconds are summed and TPOT taken per prompt after its first token."""
    tokens: dict[int, list[int]] = {}
    seconds, tpots = 0.0, []
    for index, prompt in enumerate(prompts):
        start = time.perf_counter()
        new, first = generate(prompt)
        end = time.perf_counter()
        seconds += end - start
        if first is not None and len(new) > 1:
            tpots.append((end - first) / (len(new) - 1))
        tokens[index] = new
    return pass_result(mode, 1, tokens, seconds, tpots, engine)


class HFDriver:
    """transformers ``generate``: greedy at the bench's batch size; prompt lookup and assisted
    generation at batch 1 (as HF runs them)."""

    def __init__(self, job: dict):
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        torch.set_num_threads(job["threads"] or os.cpu_count() or 1)
        self.job = job
        self.model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32).eval()
        self.assistant = None
        if job.get("draft_dir"):
            self.assistant = AutoModelForCausalLM.from_pretrained(job["draft_dir"], dtype=torch.float32).eval()
        self.modes = list(job["modes"])
        _generate(self.model, job["prompts"][:1], job, "hf_greedy")  # warm-up, untimed

    def run(self, mode: str) -> dict:
        return run_peer(self.model, self.job, mode, self.assistant)


def _driver(family: str, job: dict):
    import importlib

    module, name = FAMILIES[family][1].split(":")
    return getattr(importlib.import_module(module), name)(job)


def main() -> None:
    """``python -m spdflow.peers FAMILY``: see :class:`PeerProcess` for the protocol.

    Libraries that print to stdout (model builders, C libraries) are sent to stderr, so the
    protocol channel carries JSON only."""
    family = sys.argv[1] if len(sys.argv) > 1 else "hf"
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    try:
        job = json.loads(sys.stdin.readline())
        driver = _driver(family, job)
        reply({"modes": driver.modes})
    except Exception as exc:  # noqa: BLE001 - the parent shows it as one sentence
        reply({"error": f"{type(exc).__name__}: {exc}"})
        return
    for line in sys.stdin:
        if not line.strip():
            continue
        mode = json.loads(line)["run"]
        try:
            reply(driver.run(mode))
        except Exception as exc:  # noqa: BLE001
            reply({"error": f"{mode}: {type(exc).__name__}: {exc}"})
            return


if __name__ == "__main__":
    main()
