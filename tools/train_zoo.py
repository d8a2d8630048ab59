"""Reproduce the zoo models (spdflow/zoo/tinycode-target, tinycode-draft) from their training.json.

    python tools/train_zoo.py --preset draft --out runs/zoo-draft --minutes 10
    python tools/train_zoo.py --preset target --out runs/zoo-target --resume   # continue
    python tools/train_zoo.py --preset draft --out /tmp/z --max-steps 3        # smoke test

What it reproduces (zoo/README.md, research/feasibility.md §5):

* architecture: the zoo model's ``config.json`` (Llama, tied embeddings), random init;
* corpus: every ``*.py`` file of the running CPython's stdlib except site-packages and the
  held-out files (int(sha256(relative posix path)) % 20 == 0, the rule the ``code`` workload
  uses to pick evaluation prompts); the held-out files are the validation set;
* tokenizer: byte-level BPE, vocab 4096, min frequency 2, ``<|endoftext|>`` (id 0, EOS and BOS)
  and ``<|pad|>`` (id 1); documents joined with EOS;
* optimisation: AdamW (betas 0.9/0.95, weight decay 0.1), linear warmup then cosine decay to
  10 %, gradient clipping 1.0, bf16 autocast on CPU;
* phases as recorded in training.json: the target first at sequence 256 (batch 16, lr 2e-3),
  then continued from those weights at sequence 1024 (batch 4, lr 6e-4); the draft in one phase
  at 512 (batch 8, lr 3e-3). Step counts default to the recorded ones.

Resumable: a checkpoint (model, optimizer, phase, step, log) is written atomically every
``--checkpoint-every`` steps and when the ``--minutes`` budget runs out; ``--resume`` continues
it. The finished model is written in Hugging Face format to ``OUT/model`` with its
``training.json``. Not run in CI (hours of CPU); the smoke test above takes under a minute.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "plugins")]  # run from a checkout without installing

from spdflow_workloads import is_held_out, stdlib_dir  # noqa: E402  (one definition of the split)

from spdflow.zoo import zoo_path  # noqa: E402

EOS, PAD = "<|endoftext|>", "<|pad|>"
VOCAB_SIZE = 4096
WARMUP_STEPS = 100
EVAL_BATCHES = 8


@dataclass
class Phase:
    """One training phase: sequence length, batch, peak learning rate, steps."""

    seqlen: int
    batch: int
    lr_max: float
    steps: int


def recorded_phases(preset: str) -> list[Phase]:
    """The phases the zoo model's training.json records, oldest first."""
    record = json.loads((zoo_path(f"tinycode-{preset}") / "training.json").read_text())
    chain = []
    while record:
        chain.append(Phase(record["seqlen"], record["batch"], record["lr_max"], record["steps"]))
        record = record.get("phase1")
    return chain[::-1]


# ------------------------------------------------------------------------------------------
# corpus and tokenizer


def corpus_files(root: Path) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files): the stdlib ``.py`` files outside site-packages."""
    train, held = [], []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in ("site-packages", "__pycache__"))
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(directory) / name
                (held if is_held_out(path.relative_to(root).as_posix()) else train).append(path)
    return train, held


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # a few test files are deliberately in legacy encodings


def train_tokenizer(files: list[Path], out_dir: Path):
    """A byte-level BPE like the zoo's, saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    texts = [t for t in (read_text(p) for p in files) if t]
    bpe.train_from_iterator(texts, vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=[EOS, PAD])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=EOS, eos_token=EOS, pad_token=PAD)
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def encode(tokenizer, files: list[Path]) -> np.ndarray:
    """All files as one uint16 token stream, each document followed by EOS."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    texts = [t for t in (read_text(p) for p in files) if t]
    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def prepare_data(out: Path, tokenizer_file: Path | None, max_files: int | None):
    """Tokenizer and token streams, built once and kept in ``out`` for resumed runs."""
    from transformers import PreTrainedTokenizerFast

    tok_dir = out / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        train, held = corpus_files(stdlib_dir())
        if max_files:
            train, held = train[:max_files], held[: max(1, max_files // 20)]
        if tokenizer_file:
            tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), bos_token=EOS, eos_token=EOS, pad_token=PAD)
            tok.save_pretrained(tok_dir)
        else:
            log(f"training the tokenizer on {len(train)} files")
            tok = train_tokenizer(train, tok_dir)
        log("encoding the corpus")
        np.save(out / "train.npy", encode(tok, train))
        np.save(out / "val.npy", encode(tok, held))
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    return tok, np.load(out / "train.npy"), np.load(out / "val.npy")


# ------------------------------------------------------------------------------------------
# training


def log(message: str) -> None:
    print(f"[train_zoo] {message}", file=sys.stderr, flush=True)


def windows(tokens: np.ndarray, batch: int, seqlen: int, rng: np.random.Generator):
    """A batch of random (input, target) windows of ``seqlen`` tokens."""
    import torch

    starts = rng.integers(0, len(tokens) - seqlen - 1, size=batch)
    block = np.stack([tokens[s:s + seqlen + 1] for s in starts]).astype(np.int64)
    block = torch.from_numpy(block)
    return block[:, :-1], block[:, 1:]


def learning_rate(step: int, phase: Phase) -> float:
    """Linear warmup, then cosine decay to 10 % of the peak at the phase's last step."""
    warmup = min(WARMUP_STEPS, max(1, phase.steps // 10))
    if step < warmup:
        return phase.lr_max * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, phase.steps - warmup))
    return phase.lr_max * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def loss_of(model, inputs, targets):
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def evaluate(model, val: np.ndarray, phase: Phase) -> float:
    """Mean loss on fixed held-out windows (same windows every evaluation)."""
    import torch

    rng = np.random.default_rng(1234)
    model.eval()
    with torch.no_grad():
        losses = [loss_of(model, *windows(val, phase.batch, phase.seqlen, rng)).item() for _ in range(EVAL_BATCHES)]
    model.train()
    return float(np.mean(losses))


def save_atomic(obj, path: Path) -> None:
    import torch

    temp = path.with_suffix(".tmp")
    torch.save(obj, temp)
    os.replace(temp, path)


def build_model(preset: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(zoo_path(f"tinycode-{preset}"))
    return AutoModelForCausalLM.from_config(config)


def train(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, train_ids, val_ids = prepare_data(out, args.tokenizer, args.max_files)
    phases = recorded_phases(args.preset)
    model = build_model(args.preset)
    state = {"phase": 0, "step": 0, "tokens_seen": 0, "minutes": 0.0, "log": [], "done": []}
    checkpoint = out / "checkpoint.pt"
    optimizer_state = None
    if args.resume and checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer_state, state = saved["optimizer"], saved["state"]
        log(f"resumed at phase {state['phase'] + 1}, step {state['step']}")
    started = time.time() - state["minutes"] * 60
    budget_s = args.minutes * 60 if args.minutes else math.inf
    params = sum(p.numel() for p in model.parameters())

    while state["phase"] < len(phases):
        phase = phases[state["phase"]]
        if args.max_steps:
            phase = Phase(phase.seqlen, phase.batch, phase.lr_max, min(phase.steps, args.max_steps))
        optimizer = torch.optim.AdamW(model.parameters(), lr=phase.lr_max, betas=(0.9, 0.95), weight_decay=0.1)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
            optimizer_state = None
        log(f"phase {state['phase'] + 1}/{len(phases)}: {asdict(phase)}")
        while state["step"] < phase.steps:
            step = state["step"]
            rng = np.random.default_rng([args.seed, state["phase"], step])  # resume-stable batches
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, phase)
            loss = loss_of(model, *windows(train_ids, phase.batch, phase.seqlen, rng))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            state["step"] += 1
            state["tokens_seen"] += phase.batch * phase.seqlen
            state["minutes"] = (time.time() - started) / 60
            if step % args.eval_every == 0 or state["step"] == phase.steps:
                entry = {"step": step, "train": loss.item(), "val": evaluate(model, val_ids, phase), "t": state["minutes"] * 60}
                state["log"].append(entry)
                log(f"step {step}: train {entry['train']:.3f} val {entry['val']:.3f}")
            out_of_time = time.time() - started > budget_s
            if state["step"] % args.checkpoint_every == 0 or out_of_time:
                save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, checkpoint)
            if out_of_time:
                resume = [] if "--resume" in sys.argv else ["--resume"]
                log(f"--minutes budget used; resume with: python {' '.join(sys.argv + resume)}")
                return 0
        heldout = evaluate(model, val_ids, phase)
        state["done"].append({
            "preset": args.preset, "params": params, "steps": phase.steps, "tokens_seen": state["tokens_seen"],
            "train_tokens": int(len(train_ids)), "heldout_loss": heldout, "heldout_ppl": math.exp(heldout),
            "minutes": state["minutes"], "batch": phase.batch, "seqlen": phase.seqlen, "lr_max": phase.lr_max,
            "init": f"continued from phase{state['phase']} (below) at sequence length {phase.seqlen}" if state["phase"] else None,
            "log": state["log"],
        })
        state.update(phase=state["phase"] + 1, step=0, tokens_seen=0, log=[])
        started = time.time()
        state["minutes"] = 0.0
        save_atomic({"model": model.state_dict(), "optimizer": None, "state": state}, checkpoint)

    write_model(out / "model", model, tokenizer, state["done"])
    log(f"done: {out / 'model'}")
    return 0


def training_record(done: list[dict]) -> dict:
    """training.json: the last phase at the top, earlier phases nested as phase1 (zoo format)."""
    record = dict(done[-1])
    if len(done) > 1:
        record["phase1"] = training_record(done[:-1])
    return record


def write_model(model_dir: Path, model, tokenizer, done: list[dict]) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (model_dir / "training.json").write_text(json.dumps(training_record(done), indent=1))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=["target", "draft"], required=True)
    parser.add_argument("--out", required=True, help="work dir: tokenizer, token streams, checkpoint, model/")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    parser.add_argument("--minutes", type=float, default=None, help="stop (with a checkpoint) after this wall time")
    parser.add_argument("--max-steps", type=int, default=None, help="cap every phase at this many steps (smoke tests)")
    parser.add_argument("--max-files", type=int, default=None, help="use only the first N training files (smoke tests)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="reuse this tokenizer.json instead of training one")
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(train(parse_args()))
