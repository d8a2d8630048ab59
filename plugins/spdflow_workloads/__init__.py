"""Built-in prompt sets: ``code``, ``rare``, ``chat``, ``edit`` and ``qa`` (the recipe's ``workload.builtin``),
plus the evaluation-only ``stdlib_tests`` and ``thirdparty`` (:data:`EVALUATION_ONLY`).

``chat``, ``edit`` and ``qa`` are for instruct models: their factories carry ``chat = True``, so
the run renders them with the model's chat template (``spdflow.chat``) unless ``workload.chat: false``;
``edit`` and ``qa`` return chats (lists of messages), the others plain text.

Every factory is ``factory(count, seed) -> list[str]``: deterministic for a given (count, seed),
offline, and fast (the stdlib scan behind ``code`` is done once per process). When ``count``
exceeds the distinct prompts a set has, prompts repeat in the same seeded order.
"""
from __future__ import annotations

import ast
import bisect
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from spdflow import hookimpl
from spdflow.errors import SpdflowError
from spdflow.workload import prompts_digest  # noqa: F401  (re-exported: the thirdparty docstring's digest)

#: A stdlib file is held out of the zoo's training data when
#: int(sha256(relative posix path).hexdigest(), 16) % HOLDOUT_MODULUS == 0 (zoo/README.md).
HOLDOUT_MODULUS = 20

#: Prompt length bounds in tokens of the zoo tokenizer (prompts stay well below ctx_len 512).
MIN_PROMPT_TOKENS = 100
MAX_PROMPT_TOKENS = 300

#: Body lines after the signature and docstring that a code prompt keeps (before length fitting).
BODY_LINES = 6

#: Directories of test modules (skipped by ``code``, the only source of ``stdlib_tests``).
_TEST_DIRS = {"test", "tests", "idle_test"}
#: Directories never walked: not stdlib, or test modules (see held_out_files).
_SKIP_DIRS = {"site-packages", "__pycache__"} | _TEST_DIRS

#: Workloads no K-policy parameter was ever fitted on: report them apart from the tuned-on ones
#: (code, rare, edit, the synthetic proposer), as evaluation of what the tuning generalises to.
EVALUATION_ONLY = ("stdlib_tests", "thirdparty")


# ------------------------------------------------------------------------------------------
# the held-out split


def is_held_out(relative_path: str) -> bool:
    """Whether the stdlib file at ``relative_path`` (posix, relative to the stdlib dir) was
    held out of the zoo models' training data."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).hexdigest()
    return int(digest, 16) % HOLDOUT_MODULUS == 0


def stdlib_dir() -> Path:
    """The running interpreter's stdlib source directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def held_out_files(root: Path | None = None) -> list[str]:
    """Relative posix paths of the held-out stdlib ``.py`` files used for prompts, sorted.

    site-packages is not stdlib (the training excluded it). Test modules were training data
    too, but prompts skip them: runs of near-identical assertions would make ``code`` measure
    test boilerplate rather than library code.
    """
    root = root or stdlib_dir()
    paths = []
    for directory, subdirs, files in os.walk(root):
        # prune while walking: site-packages alone can hold tens of thousands of files
        subdirs[:] = [d for d in subdirs if d not in _SKIP_DIRS]
        base = Path(directory).relative_to(root).as_posix()
        for name in files:
            if name.endswith(".py") and not name.startswith("test_"):
                relative = name if base == "." else f"{base}/{name}"
                if is_held_out(relative):
                    paths.append(relative)
    return sorted(paths)


def held_out_test_files(root: Path | None = None) -> list[str]:
    """Relative posix paths of the held-out stdlib test modules: the ``.py`` files under a
    ``test``/``tests``/``idle_test`` directory or named ``test_*``, that :func:`held_out_files`
    skips — so ``stdlib_tests`` and ``code`` never share a file. Sorted."""
    root = root or stdlib_dir()
    paths = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in {"site-packages", "__pycache__"})
        base = Path(directory).relative_to(root).as_posix()
        in_tests = base != "." and bool(set(base.split("/")) & _TEST_DIRS)
        for name in files:
            if name.endswith(".py") and (in_tests or name.startswith("test_")):
                relative = name if base == "." else f"{base}/{name}"
                if is_held_out(relative):
                    paths.append(relative)
    return sorted(paths)


# ------------------------------------------------------------------------------------------
# code: function openings cut from held-out stdlib modules


@dataclass(frozen=True)
class CodePrompt:
    """One code prompt and where it was cut from."""

    path: str  # relative to the stdlib dir
    line: int  # 1-based line of the def (or its first decorator)
    text: str


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from tokenizers import Tokenizer

    from spdflow.zoo import zoo_path

    return Tokenizer.from_file(str(zoo_path("tinycode-target") / "tokenizer.json"))


def count_tokens(text: str) -> int:
    """Tokens of ``text`` under the zoo tokenizer."""
    return len(_tokenizer().encode(text).ids)


def _dedent(lines: list[str], indent: int) -> list[str]:
    # Strip the def's own indentation; docstring lines indented less lose only what they have.
    return [line[min(indent, len(line) - len(line.lstrip(" "))):] for line in lines]


def _function_prompt(lines: list[str], node: ast.AST) -> str | None:
    """Signature + docstring + the first body lines of ``node``, fitted to the token bounds.

    At least two lines of the function are left out, so the model has something to complete.
    """
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    body = node.body
    has_docstring = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
        and isinstance(body[0].value.value, str)
    header_end = body[0].end_lineno if has_docstring else body[0].lineno - 1
    last_cut = node.end_lineno - 2
    if last_cut <= header_end:
        return None
    indent = len(lines[start - 1]) - len(lines[start - 1].lstrip(" "))
    function = _dedent(lines[start - 1:node.end_lineno], indent)
    tokens_up_to = _prefix_token_counter("\n".join(function))

    def text(cut: int) -> str:
        return "\n".join(function[:cut - start + 1]).rstrip()

    def tokens(cut: int) -> int:
        return tokens_up_to(len(text(cut)))

    cut = min(header_end + BODY_LINES, last_cut)
    while cut > header_end + 1 and tokens(cut) > MAX_PROMPT_TOKENS:
        cut -= 1
    while cut < last_cut and tokens(cut) < MIN_PROMPT_TOKENS:
        cut += 1
    return text(cut) if MIN_PROMPT_TOKENS <= tokens(cut) <= MAX_PROMPT_TOKENS else None


def _prefix_token_counter(text: str):
    """f(n) = tokens of text[:n], from one encoding of the whole text.

    Exact at line ends: the byte-level pre-tokenizer starts a new piece at every newline, so a
    prefix ending before a newline tokenizes like the same span of the whole text.
    """
    starts = [start for start, _ in _tokenizer().encode(text).offsets]
    return lambda n: bisect.bisect_left(starts, n)


def _prompts_in_file(root: Path, relative: str) -> list[CodePrompt]:
    try:
        source = (root / relative).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []  # e.g. test data written in a legacy encoding on purpose
    lines = source.splitlines()
    prompts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            text = _function_prompt(lines, node)
            if text is not None:
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                prompts.append(CodePrompt(relative, start, text))
    return prompts


@functools.lru_cache(maxsize=4)
def code_candidates(root: Path | None = None) -> tuple[CodePrompt, ...]:
    """Every code prompt the held-out stdlib yields, sorted by (path, line); cached per process."""
    root = root or stdlib_dir()
    return _openings(root, held_out_files(root) if root.is_dir() else [],
                     f"the 'code' workload needs the Python standard library sources, but no held-out "
                     f".py files were found under {root}",
                     "install the full Python (not a stripped or .pyc-only build), or use another workload")


def _openings(root: Path, files: list[str], missing: str, hint: str) -> tuple[CodePrompt, ...]:
    """The function openings of ``files`` (relative to ``root``), sorted by (path, line); no
    files is the error ``missing`` with its ``hint``."""
    if not files:
        raise SpdflowError(missing, hint=hint)
    prompts = [p for relative in files for p in _prompts_in_file(root, relative)]
    return tuple(sorted(prompts, key=lambda p: (p.path, p.line)))


def _seeded_pick(items: tuple, count: int, seed: int) -> list:
    """``count`` items in a seeded order; past len(items) the same order repeats."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[order[i % len(order)]] for i in range(count)]


def code_prompts(count: int, seed: int) -> list[CodePrompt]:
    """``count`` code prompts with their source location."""
    return _seeded_pick(code_candidates(), count, seed)


def code_workload(count: int, seed: int) -> list[str]:
    """Openings of functions (def line, docstring, first body lines; 100–300 zoo tokens) from
    the stdlib modules held out of the zoo's training data."""
    return [p.text for p in code_prompts(count, seed)]


# ------------------------------------------------------------------------------------------
# stdlib_tests and thirdparty: evaluation-only function openings from other sources


@functools.lru_cache(maxsize=4)
def stdlib_test_candidates(root: Path | None = None) -> tuple[CodePrompt, ...]:
    """Every function opening of the held-out stdlib test modules, sorted by (path, line)."""
    root = root or stdlib_dir()
    return _openings(root, held_out_test_files(root) if root.is_dir() else [],
                     f"the 'stdlib_tests' workload needs the Python standard library's test modules, but no held-out "
                     f"test .py files were found under {root}",
                     "install a Python that ships its test suite (e.g. Debian's libpython3-testsuite), or use another workload")


def stdlib_tests_workload(count: int, seed: int) -> list[str]:
    """Evaluation only: function openings (as ``code``: 100–300 zoo tokens) from the held-out
    stdlib test modules, which ``code`` skips. Test code is a different kind: fixtures, runs of
    assertions, literal test data."""
    return [p.text for p in _seeded_pick(stdlib_test_candidates(), count, seed)]


#: The pure-Python packages among spdflow's required dependencies (pyproject.toml): installed
#: wherever spdflow is, and never in the zoo's training data (which excluded site-packages).
THIRDPARTY_PACKAGES = ("click", "pluggy", "yaml")


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def thirdparty_versions() -> dict[str, str | None]:
    """The installed version of each :data:`THIRDPARTY_PACKAGES` package (None when absent):
    the ``thirdparty`` prompts depend on them (see :func:`prompts_digest`)."""
    distributions = {"yaml": "PyYAML"}
    versions = {}
    for name in THIRDPARTY_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(distributions.get(name, name))
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.lru_cache(maxsize=2)
def thirdparty_candidates(packages: tuple[str, ...] = THIRDPARTY_PACKAGES) -> tuple[CodePrompt, ...]:
    """Every function opening of the installed ``packages``' modules; a prompt's path is
    ``<package>/<file>``. Sorted by (path, line)."""
    prompts = []
    for name in packages:
        directory = _package_dir(name)
        if directory is None or not directory.is_dir():
            continue
        root = directory.parent
        files = sorted(p.relative_to(root).as_posix() for p in directory.rglob("*.py") if "__pycache__" not in p.parts)
        prompts += [p for relative in files for p in _prompts_in_file(root, relative)]
    if not prompts:
        raise SpdflowError(f"the 'thirdparty' workload found no Python sources in the packages {', '.join(packages)}",
                           hint="install spdflow with its dependencies (pip install spdflow), or use another workload")
    return tuple(sorted(prompts, key=lambda p: (p.path, p.line)))


def thirdparty_workload(count: int, seed: int) -> list[str]:
    """Evaluation only: function openings (as ``code``) from pure-Python packages spdflow depends
    on (click, pluggy, PyYAML): code by other authors, in other styles, that the zoo never saw.
    The prompts follow the installed versions (:func:`thirdparty_versions`): compare runs by
    their prompts' digest (:func:`prompts_digest`; ``spdflow bench`` records it)."""
    return [p.text for p in _seeded_pick(thirdparty_candidates(), count, seed)]


# ------------------------------------------------------------------------------------------
# rare: prompts that give prompt lookup little to match


#: 64 plain English words, none a Python keyword or common identifier.
_RARE_WORDS = (
    "the", "river", "keeps", "a", "quiet", "record", "of", "every", "storm", "that", "passes",
    "over", "hills", "where", "old", "farmers", "planted", "apples", "beside", "crooked", "stone",
    "walls", "near", "towns", "whose", "bells", "ring", "twice", "at", "dusk", "heron", "amber",
    "glacier", "juniper", "lichen", "saffron", "tundra", "willow", "bramble", "cinder", "meadow",
    "lantern", "harbor", "orchard", "thistle", "copper", "valley", "morning", "whisper", "canyon",
    "pebble", "sparrow", "velvet", "marble", "autumn", "island", "forest", "candle", "ribbon",
    "shadow", "winter", "garden", "violet", "harvest",
)
#: Words per rare prompt (about 70 zoo tokens).
RARE_PROMPT_WORDS = 24

#: What ``rare`` does to prompt lookup, measured on the zoo target (see rare_workload).
RARE_MEASUREMENT = {
    "setup": "zoo tinycode-target via transformers; 16 prompts (seed 0), 64 new tokens each; "
    "prompt lookup n=3..1, longest continuation, K=4, simulated step by step on the output",
    "rare, temperature 1.0": {"proposal_rate": 0.28, "draft_acceptance_rate": 0.07, "mean_acceptance_length": 1.07},
    "rare, greedy": {"proposal_rate": 0.56, "draft_acceptance_rate": 0.63, "mean_acceptance_length": 2.29},
    "code, greedy": {"proposal_rate": 0.68, "draft_acceptance_rate": 0.48, "mean_acceptance_length": 2.25},
    "code, temperature 1.0": {"proposal_rate": 0.44, "draft_acceptance_rate": 0.11, "mean_acceptance_length": 1.18},
}


def _rare_prompt(rng: random.Random) -> str:
    """Distinct English words in random order: prose the code model never saw, no word twice."""
    return " ".join(rng.sample(_RARE_WORDS, RARE_PROMPT_WORDS)).capitalize() + "."


def rare_workload(count: int, seed: int) -> list[str]:
    """Prompts on which proposers find little to propose.

    The zoo model repeats itself under greedy decoding, and prompt lookup feeds on repetition:
    on ``code`` it proposes on most steps. No prompt alone can stop a greedy model from
    repeating, so the ``rare`` recipe also samples at temperature 1.0; the prompts do the rest.
    Each is a line of distinct English words in random order: no n-gram of the prompt repeats,
    and the code-trained model, sampled on prose it never saw, continues with high-entropy text
    that rarely repeats what came before, so lookups mostly find nothing and what they propose
    the target rejects. The measured effect is in ``RARE_MEASUREMENT``: proposals on 28 % of
    steps and 7 % of drafts accepted (AL 1.07), against 68 % and 48 % (AL 2.25) for ``code``
    greedy; the same prompts decoded greedily give AL 2.29, hence the temperature. (An earlier design, dict literals of random hex constants, left AL at 1.12:
    the punctuation frame repeats and gives lookups something to match.)
    """
    rng = random.Random(f"rare:{seed}")
    return [_rare_prompt(rng) for _ in range(count)]


# ------------------------------------------------------------------------------------------
# chat: general instructions for chat/instruct models


CHAT_PROMPTS = (
    "Explain the difference between a process and a thread in two short paragraphs.",
    "Write a haiku about a lighthouse in winter.",
    "Give me three tips for writing clear commit messages, with one example each.",
    "What causes the seasons on Earth? Answer for a ten-year-old.",
    "Summarize the plot of Romeo and Juliet in five sentences.",
    "Write a Python function that checks whether a string is a palindrome, and explain it.",
    "List five healthy breakfast ideas that take less than ten minutes to make.",
    "Translate into French: 'The meeting has been moved to Thursday afternoon.'",
    "What are the pros and cons of working from home? Use a bulleted list.",
    "Draft a polite email asking a colleague to review a document by Friday.",
    "Explain what a hash table is and why lookups are usually fast.",
    "Suggest a three-day itinerary for a first visit to Rome.",
    "How does compound interest work? Include a small numeric example.",
    "Write a short motivational message for a team finishing a hard project.",
    "Compare SQL and NoSQL databases in a table with four rows.",
    "What is speculative decoding in large language models, in plain words?",
)


def chat_workload(count: int, seed: int) -> list[str]:
    """General chat and instruction prompts (for instruction-tuned models such as
    Llama-3.1-8B-Instruct), in a seeded order."""
    return _seeded_pick(CHAT_PROMPTS, count, seed)


# ------------------------------------------------------------------------------------------
# edit and qa: chat workloads for instruct models (rendered with the model's chat template)

#: Whole functions an ``edit`` prompt quotes: at most this many lines and zoo tokens.
EDIT_MAX_LINES = 24
EDIT_MIN_LINES = 6
EDIT_MAX_TOKENS = 400

EDIT_INSTRUCTIONS = (
    "Add type hints to this Python function. Reply with the complete function only.",
    "Rename the local variables of this Python function to clearer names. Reply with the complete function only.",
    "Add a short comment above each block of this Python function. Reply with the complete function only.",
    "Rewrite this Python function so it follows PEP 8. Reply with the complete function only.",
)

QA_QUESTIONS = (
    "What is the module described in this passage for?",
    "Which functions, classes or objects does this passage mention? Answer with a short list.",
    "Explain this passage to a beginner in three sentences.",
    "What limitations or caveats does this passage mention, if any?",
)
#: Module docstrings a ``qa`` passage uses: at least this many words, cut to at most QA_MAX_WORDS.
QA_MIN_WORDS = 40
QA_MAX_WORDS = 220


def _whole_functions(root: Path, relative: str) -> list[tuple[str, int, str]]:
    try:
        source = (root / relative).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.decorator_list:
            length = node.end_lineno - node.lineno + 1
            if EDIT_MIN_LINES <= length <= EDIT_MAX_LINES:
                indent = len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip(" "))
                text = "\n".join(_dedent(lines[node.lineno - 1:node.end_lineno], indent)).rstrip()
                if count_tokens(text) <= EDIT_MAX_TOKENS:
                    found.append((relative, node.lineno, text))
    return found


@functools.lru_cache(maxsize=2)
def edit_candidates(root: Path | None = None) -> tuple[tuple[str, int, str], ...]:
    """Whole short functions (6–24 lines) of the held-out stdlib modules, sorted by (path, line)."""
    root = root or stdlib_dir()
    files = held_out_files(root) if root.is_dir() else []
    found = sorted(f for relative in files for f in _whole_functions(root, relative))
    if not found:
        raise SpdflowError(f"the 'edit' workload needs the Python standard library sources, but none were found under {root}",
                           hint="install the full Python (not a stripped or .pyc-only build), or use another workload")
    return tuple(found)


def edit_workload(count: int, seed: int) -> list[list[dict]]:
    """Chats asking an instruct model to rewrite a real stdlib function: the answer mostly copies
    the function (prompt lookup's case)."""
    picked = _seeded_pick(edit_candidates(), count, seed)
    rng = random.Random(f"edit:{seed}")
    return [[{"role": "user", "content": f"{rng.choice(EDIT_INSTRUCTIONS)}\n\n```python\n{text}\n```"}]
            for _path, _line, text in picked]


@functools.lru_cache(maxsize=2)
def qa_passages(root: Path | None = None) -> tuple[tuple[str, str], ...]:
    """(module path, docstring passage) of every stdlib module whose docstring is long enough."""
    root = root or stdlib_dir()
    found = []
    for relative in sorted(p.relative_to(root).as_posix() for p in root.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse((root / relative).read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        words = (doc or "").split()
        if len(words) >= QA_MIN_WORDS:
            paragraphs = doc.strip().split("\n\n")
            passage, total = [], 0
            for paragraph in paragraphs:
                size = len(paragraph.split())
                if passage and total + size > QA_MAX_WORDS:
                    break
                passage.append(paragraph.strip())
                total += size
            found.append((relative, "\n\n".join(passage)))
    if not found:
        raise SpdflowError(f"the 'qa' workload needs the Python standard library sources, but none were found under {root}",
                           hint="install the full Python (not a stripped or .pyc-only build), or use another workload")
    return tuple(found)


def qa_workload(count: int, seed: int) -> list[list[dict]]:
    """Chats asking a question over a passage (a stdlib module's docstring): open answers that
    copy little, where speculation must not cost much."""
    picked = _seeded_pick(qa_passages(), count, seed)
    rng = random.Random(f"qa:{seed}")
    return [[{"role": "user", "content": f"Read this passage.\n\n{passage}\n\n{rng.choice(QA_QUESTIONS)}"}]
            for _path, passage in picked]


#: Built-in sets written for instruct models: rendered with the model's chat template unless
#: the recipe says ``workload.chat: false``.
edit_workload.chat = True
qa_workload.chat = True
chat_workload.chat = True


@hookimpl
def spdflow_register_workloads(register):
    register("code", code_workload, description="Function openings from the stdlib modules held out of the zoo's training data.")
    register("rare", rare_workload, description="Lines of distinct English words: little for proposers to match (pair with temperature 1.0).")
    register("chat", chat_workload, description="General chat and instruction prompts for instruct models.")
    register("edit", edit_workload, description="Chats asking to rewrite a whole stdlib function (the answer copies it).")
    register("qa", qa_workload, description="Chats asking a question over a passage (a stdlib module's docstring).")
    register("stdlib_tests", stdlib_tests_workload,
             description="Evaluation only (no K-policy tuning): function openings from the held-out stdlib test modules.")
    register("thirdparty", thirdparty_workload,
             description="Evaluation only (no K-policy tuning): function openings from click, pluggy and PyYAML "
                         "(prompts follow the installed versions).")
