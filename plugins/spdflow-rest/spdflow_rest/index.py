"""The corpus index: a token stream and its suffix array, built once and cached on disk.

The stream is every indexed file's tokens followed by a separator (an id no vocabulary uses),
then ``depth`` more separators so reads past a document's end never leave the array. The suffix
array lists the stream's token positions (not separators) sorted by their next ``depth``
tokens — prefix doubling stopped at ``depth``, which is all that a lookup (``max_suffix_len``)
plus a proposal (``max_proposal_len``) ever reads. Lookups compare big-endian uint32 bytes, so
``bytes`` comparison is token-wise lexicographic order and binary search runs at C speed.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

log = logging.getLogger("spdflow_rest")

#: The separator after each document; sorts after every real token id.
SEP = 0xFFFFFFFF
#: Bumped when the file layout or the sort changes: old cache files are then rebuilt.
INDEX_FORMAT = 1


# ------------------------------------------------------------------------------ suffix array


def build_suffix_array(stream: np.ndarray, depth: int) -> np.ndarray:
    """Positions of ``stream`` sorted by their next ``depth`` tokens (ties by position).

    Prefix doubling: after the round with step h every position's rank orders its first 2h
    tokens; we stop once 2h >= depth or every rank is distinct. O(n log n log depth) in numpy.
    """
    n = len(stream)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, rank = np.unique(stream, return_inverse=True)
    rank = rank.astype(np.int64).reshape(-1)
    order = np.argsort(rank, kind="stable")
    h = 1
    while h < depth:
        following = np.full(n, -1, dtype=np.int64)
        following[: n - h] = rank[h:]
        key = rank * (n + 1) + (following + 1)
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.concatenate(([0], np.cumsum(sorted_key[1:] != sorted_key[:-1])))
        h *= 2
        if rank[order[-1]] == n - 1:  # all distinct: longer prefixes cannot reorder
            break
    return order


@dataclass
class CorpusIndex:
    """A tokenized corpus and its suffix array, with lookup and continuation."""

    stream: np.ndarray  # uint32 [n + depth], documents separated (and padded) by SEP
    suffixes: np.ndarray  # int64 positions of real tokens, sorted by their next `depth` tokens
    depth: int
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._bytes = self.stream.astype(">u4").tobytes()

    @property
    def num_tokens(self) -> int:
        return len(self.suffixes)

    def _prefix(self, i: int, nbytes: int) -> bytes:
        start = 4 * int(self.suffixes[i])
        return self._bytes[start : start + nbytes]

    def find(self, pattern) -> tuple[int, int]:
        """The suffix-array range [lo, hi) of the occurrences of ``pattern`` (len <= depth)."""
        key = np.asarray(pattern, dtype=">u4").tobytes()
        n, width = len(self.suffixes), len(key)
        lo, hi = 0, n
        while lo < hi:  # first prefix >= key
            mid = (lo + hi) // 2
            if self._prefix(mid, width) < key:
                lo = mid + 1
            else:
                hi = mid
        first, hi = lo, n
        while lo < hi:  # first prefix > key
            mid = (lo + hi) // 2
            if self._prefix(mid, width) <= key:
                lo = mid + 1
            else:
                hi = mid
        return first, lo

    def longest_match(self, context: np.ndarray, min_len: int, max_len: int) -> tuple[int, int, int] | None:
        """(m, lo, hi) for the longest suffix of ``context`` (min_len <= m <= max_len) that
        occurs in the corpus, else None. A suffix that occurs implies every shorter one does,
        so the length is found by binary search."""
        max_len = min(max_len, len(context), self.depth)
        if max_len < min_len:
            return None
        best = None
        lo_len, hi_len = min_len, max_len
        while lo_len <= hi_len:
            m = (lo_len + hi_len) // 2
            lo, hi = self.find(context[len(context) - m :])
            if hi > lo:
                best = (m, lo, hi)
                lo_len = m + 1
            else:
                hi_len = m - 1
        return best

    def continuation(self, m: int, lo: int, hi: int, max_len: int, min_count: int, min_prob: float) -> np.ndarray:
        """The most frequent continuation of the matches suffixes[lo:hi] of length ``m``.

        Token by token: among the remaining matches the next tokens are sorted (the array is
        sorted by ``depth`` tokens), so each candidate is a run; take the longest run, keep only
        its matches, and go on. Stops at a separator, at ``min_count`` or ``min_prob``.
        """
        draft: list[int] = []
        offset = m
        max_len = min(max_len, self.depth - m)
        while len(draft) < max_len and hi > lo:
            following = self.stream[self.suffixes[lo:hi] + offset]
            edges = np.flatnonzero(following[1:] != following[:-1]) + 1
            starts = np.concatenate(([0], edges))
            counts = np.diff(np.concatenate((starts, [len(following)])))
            best = int(np.argmax(counts))  # first of the longest runs: the smallest id on ties
            token, count = int(following[starts[best]]), int(counts[best])
            if token == SEP or count < min_count or count < min_prob * (hi - lo):
                break
            draft.append(token)
            lo, hi = lo + int(starts[best]), lo + int(starts[best]) + count
            offset += 1
        return np.asarray(draft, dtype=np.int64)


# ------------------------------------------------------------------------------ corpus


def corpus_files(root: Path, pattern: str, exclude: Sequence[str] = ()) -> list[Path]:
    """Files under ``root`` matching ``pattern`` in sorted order, skipping hidden paths,
    ``__pycache__`` and paths matching an ``exclude`` pattern; ``root`` itself when it is a file."""
    if root.is_file():
        return [root]

    def skip(path: Path) -> bool:
        relative = path.relative_to(root)
        if any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
            return True
        return any(fnmatch.fnmatchcase(relative.as_posix(), rule) for rule in exclude)

    return sorted(p for p in root.glob(pattern) if p.is_file() and not skip(p))


def decode_text(raw: bytes) -> str | None:
    """The file's text, or None for binary (a NUL byte) and non-UTF-8 files."""
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def tokenize(texts: list[str], tokenizer, max_tokens: int, batch: int = 64) -> tuple[np.ndarray, int]:
    """The token stream of ``texts`` (each followed by SEP), capped at ``max_tokens`` real
    tokens; returns (stream without padding, number of documents used)."""
    parts: list[np.ndarray] = []
    total = used = 0
    for start in range(0, len(texts), batch):
        for encoding in tokenizer.encode_batch(texts[start : start + batch], add_special_tokens=False):
            ids = np.asarray(encoding.ids[: max_tokens - total], dtype=np.uint32)
            if len(ids):
                parts += [ids, np.array([SEP], dtype=np.uint32)]
                total += len(ids)
                used += 1
            if total >= max_tokens:
                return np.concatenate(parts), used
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)), used


def build_index(texts: list[str], tokenizer, max_tokens: int, depth: int) -> CorpusIndex:
    """Tokenize ``texts`` and sort their suffixes."""
    started = time.perf_counter()
    stream, used = tokenize(texts, tokenizer, max_tokens)
    order = build_suffix_array(stream, depth)
    suffixes = order[stream[order] != SEP]
    padded = np.concatenate((stream, np.full(depth, SEP, dtype=np.uint32)))
    info = {"documents": used, "tokens": int(len(suffixes)), "build_s": round(time.perf_counter() - started, 3)}
    return CorpusIndex(padded, suffixes.astype(np.int64), depth, info)


# ------------------------------------------------------------------------------ cache


def sha256_bytes(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def index_key(file_digests: dict[str, str], tokenizer_digest: str, settings: dict) -> str:
    """sha256 of the corpus file digests, the tokenizer's digest and the index settings."""
    payload = {"format": INDEX_FORMAT, "files": file_digests, "tokenizer": tokenizer_digest, "settings": settings}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def save_index(index: CorpusIndex, path: Path, key: str) -> None:
    """Write the index to ``path`` atomically: a temp file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"key": key, "depth": index.depth, **index.info})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, stream=index.stream, suffixes=index.suffixes, meta=np.array(meta))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_index(path: Path, key: str) -> CorpusIndex | None:
    """The cached index at ``path`` if it is intact and has ``key``; None (with a warning when
    the file exists but is unusable) otherwise."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("key") != key:
                raise ValueError("its key does not match")
            info = {k: v for k, v in meta.items() if k not in ("key", "depth")}
            return CorpusIndex(data["stream"], data["suffixes"], int(meta["depth"]), info)
    except Exception as exc:  # a corrupt cache entry is a warning and a rebuild, never a failure
        warnings.warn(f"REST index '{path}' is unusable ({type(exc).__name__}: {exc}); rebuilding", stacklevel=2)
        return None


def load_or_build_index(corpus: Path, pattern: str, tokenizer_file: Path, max_tokens: int, depth: int,
                        cache_dir: Path, exclude: Sequence[str] = ()) -> CorpusIndex:
    """The index of ``corpus``: from ``cache_dir`` when an index with the same key exists,
    else built and saved there. ``index.info["cached"]`` says which."""
    from tokenizers import Tokenizer

    files = corpus_files(corpus, pattern, exclude)
    raws = [p.read_bytes() for p in files]
    names = [p.relative_to(corpus).as_posix() if corpus.is_dir() else p.name for p in files]
    digests = {name: sha256_bytes(raw) for name, raw in zip(names, raws)}
    settings = {"glob": pattern, "exclude": list(exclude), "max_corpus_tokens": max_tokens, "depth": depth}
    key = index_key(digests, sha256_bytes(Path(tokenizer_file).read_bytes()), settings)
    path = cache_dir / f"index-{key[:16]}.npz"
    index = load_index(path, key)
    if index is not None:
        index.info.update(cached=True, path=str(path), key=key[:16])
        return index
    texts = [text for text in map(decode_text, raws) if text]
    index = build_index(texts, Tokenizer.from_file(str(tokenizer_file)), max_tokens, depth)
    index.info.update(files=len(files))
    save_index(index, path, key)
    index.info.update(cached=False, path=str(path), key=key[:16])
    log.info("built REST index %s: %s", path, index.info)
    return index
