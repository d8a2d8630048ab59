"""The prompts of a run: inline, from a .txt/.jsonl file, or a registered built-in set."""
from __future__ import annotations

import json
from pathlib import Path

from spdflow.errors import RecipeError
from spdflow.recipe.schema import WorkloadSpec

MAX_PROMPT_FILE_BYTES = 16 * 1024 * 1024


def load_prompts(workload: WorkloadSpec, base_dir: Path, pm, *, allow_outside: bool = False) -> list:
    """The workload's prompts (text, or a chat: a list of messages), at most ``workload.count`` of them. ``workload.file`` must lie
    inside ``base_dir`` (the recipe's folder) unless ``allow_outside``."""
    from spdflow.recipe.paths import confine

    if workload.prompts is not None:
        prompts = list(workload.prompts)
    elif workload.file is not None:
        prompts = read_prompt_file(confine(base_dir / workload.file, base_dir, key=f"workload.file '{workload.file}'",
                                           allow_outside=allow_outside))
    else:
        registration = pm.lookup("workload", workload.builtin)
        prompts = list(registration.factory(workload.count, workload.seed))
    prompts = prompts[: workload.count]
    if not prompts:
        raise RecipeError("the workload has no prompts", hint="check workload.prompts / workload.file")
    return prompts


def prompts_digest(prompts: list) -> str:
    """sha256 of a workload's prompts (text or chats): tells two runs' prompts apart when a
    source can differ between machines (``thirdparty`` follows the installed packages)."""
    import hashlib

    return hashlib.sha256(json.dumps(prompts, ensure_ascii=False, sort_keys=True).encode("utf-8")).hexdigest()


def read_prompt_file(path: Path) -> list:
    """One prompt per non-empty line (.txt) or per JSON object (.jsonl) with a 'prompt' key (text)
    or a 'messages' key (a chat: [{"role": ..., "content": ...}, ...])."""
    return [text for _, text in read_prompt_file_lines(path)]


def read_prompt_file_lines(path: Path) -> list[tuple[int, object]]:
    """Like :func:`read_prompt_file`, with each prompt's line number; one sentence per problem."""
    if not path.exists():
        raise RecipeError(f"prompt file '{path}' does not exist", hint="paths are relative to the recipe's folder")
    if not path.is_file():
        raise RecipeError(f"prompt file '{path}' is not a regular file", hint="point workload.file at a .txt or .jsonl file")
    size = path.stat().st_size
    if size > MAX_PROMPT_FILE_BYTES:
        raise RecipeError(f"prompt file '{path}' is {size:,} bytes, over the {MAX_PROMPT_FILE_BYTES:,}-byte limit",
                          hint="split the file or take fewer prompts")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeError(f"prompt file '{path}' cannot be read: {exc.strerror}",
                          hint="check the file's permissions") from None
    if b"\0" in raw:
        raise RecipeError(f"prompt file '{path}' is binary, not text", hint="use a UTF-8 .txt or .jsonl file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"prompt file '{path}' is not UTF-8 text (byte {exc.start})",
                          hint="save it as UTF-8") from None
    if path.suffix == ".jsonl":
        prompts = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                if isinstance(item, dict) and "messages" in item:
                    from spdflow.chat import check_messages

                    prompts.append((number, check_messages(item["messages"], f"{path}:{number}")))
                    continue
                prompts.append((number, str(item["prompt"])))
            except (ValueError, KeyError, TypeError):
                raise RecipeError(f"{path}:{number}: each line must be a JSON object with a 'prompt' key "
                                  "or a 'messages' list") from None
        return prompts
    return [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
