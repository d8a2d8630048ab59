"""The error catalogue: every finding code and every runtime error kind, with cause and fix.

``docs/errors.md`` is generated from this table (``python -m spdflow.catalog > docs/errors.md``)
and tests fail when the two drift, when a ``SPDxxx`` code used in the source is missing here,
or when an error class of ``spdflow.errors`` has no entry.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from spdflow.errors import EXIT_CODES


@dataclass(frozen=True)
class CatalogEntry:
    """One documented error: ``code`` is ``SPDxxx`` for findings, a dotted kind otherwise."""

    code: str
    error: str  # the exception class, or "finding" / "lint warning" / "lint error"
    exit_code: int
    message: str  # the message pattern; <angle brackets> are filled in at run time
    cause: str
    fix: str


def _finding(code: str, message: str, cause: str, fix: str) -> CatalogEntry:
    return CatalogEntry(code, "finding", 3, message, cause, fix)


def _lint(code: str, message: str, cause: str, fix: str, *, error: bool = False) -> CatalogEntry:
    return CatalogEntry(code, "lint error" if error else "lint warning", 1 if error else 0, message, cause, fix)


FINDINGS: tuple[CatalogEntry, ...] = (
    _finding("SPD000", "no such file '<path>' / '<path>' is a directory / the file is not UTF-8 text / no recipe files found",
             "The recipe file cannot be read, or a lint pattern matched nothing.",
             "Check the path; recipes are UTF-8 `.yaml`/`.yml` files."),
    _finding("SPD001", "invalid YAML: <problem> / cannot read the value '<text>'",
             "The text is not valid YAML, or a scalar cannot be converted.",
             "Fix the indentation or quoting at the reported line and column."),
    _finding("SPD002", "duplicate key '<key>' (first defined at line <n>)",
             "A mapping defines the same key twice.", "Keep one of the two."),
    _finding("SPD003", "unsupported YAML tag '<tag>' / YAML merge keys ('<<') are not supported / a mapping key must be a plain string",
             "The recipe uses a YAML feature beyond plain values (e.g. `!!python/object`), which a recipe may never use.",
             "Write plain mappings, lists, strings, numbers and booleans."),
    _finding("SPD004", "the file is larger than 1000 kB / the document expands to more than 20000 values / nested deeper than 40 levels",
             "The document is oversized or an alias bomb (\"billion laughs\").",
             "Recipes are short; remove the aliases that multiply the document."),
    _finding("SPD010", "unknown key '<key>' in <section>; did you mean '<key>'?",
             "A key the schema does not know (often a typo).", "Use one of the allowed keys listed in the hint."),
    _finding("SPD011", "missing required key '<path>'", "A required key is absent.",
             "Add it; `spdflow schema` lists every key."),
    _finding("SPD012", "<path>: input should be a valid <type> / the recipe must be a YAML mapping",
             "A value has the wrong type, or the document is not a mapping.", "Give the type the schema asks for."),
    _finding("SPD013", "<path>: input should be '<a>' or '<b>'", "A value is not one of the allowed choices.",
             "Use one of the listed values."),
    _finding("SPD014", "<path>: input should be greater than or equal to <n> (got <value>)",
             "A number or list is out of its allowed range.", "Use a value inside the range."),
    _finding("SPD015", "<path>: <rule> (e.g. the K-list is empty; K must be between 0 and 64)",
             "A field validator rejected the value.", "Follow the message."),
    _finding("SPD016", "name: string should match pattern '<regex>'",
             "The run name has characters that cannot name a directory.",
             "Use letters, digits, '.', '_' and '-' (at most 64)."),
    _finding("SPD020", "unknown proposer '<name>'; did you mean '<name>'?",
             "No installed plugin registers this proposer (a module path is just an unknown name: recipes never import code).",
             "Use a name from `spdflow plugins`, or install the plugin that provides it."),
    _finding("SPD021", "unknown backend '<name>'", "No installed plugin registers this backend.",
             "Use onnxruntime or qaic, or install the backend's plugin."),
    _finding("SPD022", "unknown k policy '<name>'", "No installed plugin registers this K policy.",
             "Use smallest_covering, fixed or nospec."),
    _finding("SPD023", "unknown acceptor '<name>'", "No installed plugin registers this acceptance method.",
             "Use greedy, rejection or auto."),
    _finding("SPD024", "unknown workload '<name>'", "No installed plugin registers this built-in prompt set.",
             "Use a registered set, or workload.prompts / workload.file."),
    _finding("SPD030", "prefill_seq_len <n> is smaller than max(K)+1 = <m>",
             "A prefill chunk cannot hold the anchor plus the largest K proposals.",
             "Raise specialization.prefill_seq_len or drop the largest K."),
    _finding("SPD031", "ctx_len <n> must be larger than prefill_seq_len <m>",
             "The KV cache is not longer than one prefill chunk.", "Raise ctx_len or lower prefill_seq_len."),
    _finding("SPD032", "full_batch_size <n> is smaller than batch_size <m>",
             "Continuous batching has fewer KV slots than the prefill batch.", "Set full_batch_size >= batch_size."),
    _finding("SPD033", "device <id> is listed twice in devices.device_ids", "A device appears twice in the group.",
             "List each device once."),
    _finding("SPD034", "max_new_tokens <n> cannot fit in ctx_len <c>",
             "The generated tokens plus one prompt token do not fit in the KV cache.",
             "Use at most ctx_len - 2, or raise specialization.ctx_len."),
    _finding("SPD035", "the workload has no prompts / gives prompts in <n> ways / workload.prompts is empty",
             "The workload must take prompts from exactly one non-empty source.",
             "Set exactly one of workload.prompts, workload.file, workload.builtin."),
    _finding("SPD036", "num_speculative_tokens <list> speculates but the recipe has no proposer",
             "A K > 0 is compiled with nothing to propose tokens.",
             "Add a proposer, or set num_speculative_tokens: 0."),
    _finding("SPD037", "acceptance '<name>' with temperature <t> would change the output distribution",
             "The acceptor is not lossless at that temperature (as its plugin declares): greedy acceptance is "
             "lossless only for greedy decoding.", "Use acceptance: auto, which picks one that is lossless there."),
    _lint("SPD101", "the K-list <list> is not sorted; it is compiled as <sorted>", "An unsorted K-list reads like a mistake.",
          "Write it sorted."),
    _lint("SPD102", "K <k> is listed more than once", "Duplicate K values compile once.", "List each K once."),
    _lint("SPD103", "proposer '<name>' may propose nothing, but K=0 is not compiled",
          "Steps without proposals still pay for the smallest K.", "Add 0 to num_speculative_tokens."),
    _lint("SPD104", "backend '<name>' cannot run here: <reason>", "The backend's runtime is not on this machine.",
          "Fine for lint and --compile-only; run on a machine with the runtime."),
    _lint("SPD105", "k_policy '<policy>' needs shapes that are not compiled: <shapes>",
          "The K policy will ask for a decode shape that is not among the specializations.",
          "Add the missing K to num_speculative_tokens (nospec needs 0).", error=True),
    _lint("SPD106", "k_policy '<policy>' only runs K=<k>; the other shapes of <list> are compiled for nothing",
          "The K policy only uses some K of the list (fixed: the largest; nospec: 0).",
          "Compile only those K, or use a policy that chooses among them."),
    _lint("SPD107", "prompt file '<path>' does not exist / cannot be read / is binary / is not UTF-8 text / holds no prompts",
          "workload.file (resolved against the recipe's folder) cannot give prompts; found before any export.",
          "Fix the path or the file; .txt takes one prompt per line, .jsonl a 'prompt' per object.", error=True),
    _lint("SPD108", "workload.count is <n> but workload.<file|prompts> has <m> prompts; the run uses <m>",
          "The run would silently take fewer prompts than asked for.", "Lower workload.count or add prompts."),
    _lint("SPD109", "prompt <i> / line <n> of <file> has <t> tokens but ctx_len <c> leaves room for <c-1> / is empty",
          "A prompt does not fit in the KV cache (the target's own tokenizer counts it), or is empty.",
          "Raise specialization.ctx_len or shorten the prompt.", error=True),
    CatalogEntry("SPD110", "lint note", 0, "prompt lengths not checked against ctx_len: <why>",
                 "No tokenizer.json of the target model is on this machine, so lengths are checked only when the run starts.",
                 "Nothing to fix; a note never fails lint, not even with --strict."),
    _lint("SPD111", "model '<id>' is not a directory / is not in the local Hugging Face cache / has no config.json",
          "model.id, or a proposer's proposer.with.model, names no model on this machine (spdflow never downloads).",
          "Point the key named in the hint at a local HF folder, or put the model in the local HF cache.", error=True),
    _lint("SPD112", "<key> '<path>' resolves to '<resolved>', outside the recipe's folder",
          "model.id, proposer.with.model or workload.file (symlinks followed) leads out of the recipe's folder tree. "
          "`spdflow run` refuses it (exit 3) unless --allow-outside-paths, so a recipe from a pull request cannot "
          "read secrets into a report.",
          "Keep the files a recipe reads inside its folder, or pass --allow-outside-paths for a recipe you trust."),
    _lint("SPD121", "devices.with.comp_ctx_lengths has <n>, more than ctx_len <c>",
          "A compute context length (CCL) is longer than the KV cache.",
          "Use CCLs of at most ctx_len; ctx_len itself is always compiled.", error=True),
    _lint("SPD122", "devices.with.comp_ctx_lengths <list> is not strictly ascending; it is compiled as <sorted>",
          "An unsorted or repeated CCL list works (it is sorted and deduplicated) but reads like a mistake.",
          "Write it ascending, each length once."),
    _lint("SPD123", "devices.with.comp_ctx_lengths_prefill has <n>, less than prefill_seq_len <m>",
          "A prefill chunk reads at least prefill_seq_len cache slots, so a shorter prefill CCL could never run.",
          "Use prefill CCLs of at least prefill_seq_len.", error=True),
    _lint("SPD120", "backend '<name>' cannot compile model.dtype <dtype>: <why>",
          "The backend's compiler does not take weights of that dtype with these settings (qaic: bfloat16 for "
          "aic_hw_version ai100); the compile stage refuses it too, before writing anything.",
          "Set model.dtype: float32 (what QEfficient does for bf16 models on AI 100), or a hardware version that takes it.",
          error=True),
)

SWEEP_FINDINGS: tuple[CatalogEntry, ...] = (
    _finding("SPD301", "unknown key '<key>' in <section>; did you mean '<key>'? / '<path>' is a value, not a section",
             "A set/matrix/include/exclude key of a sweep file is not a recipe key (dotted, as --set).",
             "Use a key from the hint; `spdflow schema` lists every recipe key."),
    _finding("SPD302", "matrix key '<key>' has no values", "A matrix entry is an empty list.", "Give at least one value."),
    _finding("SPD303", "base recipe '<path>': no such file / is not a YAML mapping",
             "The sweep's base recipe cannot be read.", "base is a recipe path relative to the sweep file, or an inline recipe."),
    _finding("SPD304", "exclude key '<key>' is not a matrix key, so it can never match",
             "exclude entries only match matrix keys.", "Use matrix keys in exclude entries."),
    _finding("SPD305", "the sweep sets '<name|output>' of each point itself",
             "A sweep names each point and gives it its own output dir.", "Use the sweep's own name/output keys."),
    CatalogEntry("SPD306", "sweep warning", 0, "point <id> repeats point <id> (same recipe); it runs once",
                 "Two matrix/include combinations expand to the same recipe.", "Drop the duplicate."),
    _finding("SPD307", "the sweep has no points (everything is excluded)", "exclude removed every matrix point.",
             "Remove exclude entries or add include entries."),
    _finding("SPD308", "the matrix expands to <n> points (more than 2000)", "The cross product is very large.",
             "Split the sweep, or exclude combinations."),
    CatalogEntry("SPD309", "sweep warning", 0, "this exclude entry matches no matrix point",
                 "Its values equal no matrix combination (lists must match exactly).", "Fix or drop the entry."),
)

RUNTIME: tuple[CatalogEntry, ...] = (
    CatalogEntry("usage.set", "UsageError", 2, "--set '<expr>' is not of the form dotted.key=value / the value is not valid YAML",
                 "A malformed --set override on the command line.", "Write --set dotted.key=value, e.g. --set num_speculative_tokens=[0,2,4]."),
    CatalogEntry("recipe.invalid", "RecipeError", 3, "recipe '<path>' is invalid: <n> errors",
                 "The recipe has findings (SPD0xx), each printed above as path:line:col.", "Fix every listed finding."),
    CatalogEntry("recipe.prompt-file", "RecipeError", 3,
                 "prompt file '<path>' does not exist / is not UTF-8 text / is <n> bytes, over the 16,777,216-byte limit",
                 "workload.file (resolved against the recipe's folder) is missing, not text, or too large.",
                 "Fix the path, or split the file / take fewer prompts."),
    CatalogEntry("recipe.prompt-jsonl", "RecipeError", 3, "<path>:<line>: each line must be a JSON object with a 'prompt' key",
                 "A .jsonl prompt file has a malformed line.", "Give every line a JSON object with a 'prompt' string."),
    CatalogEntry("recipe.no-prompts", "RecipeError", 3, "the workload has no prompts",
                 "The prompt source yielded nothing (an empty file or built-in set).", "Check workload.prompts / workload.file."),
    CatalogEntry("recipe.draft-mismatch", "RecipeError", 3,
                 "draft model '<id>' has vocab <n> but target '<name>' has <m> / ... have different tokenizers",
                 "The draft_model proposer's model cannot propose tokens of the target's vocabulary.",
                 "Use a draft of the target's model family (the same tokenizer)."),
    CatalogEntry("run.preflight", "PreflightError", 1,
                 "cannot run this recipe here (<n> problems, found before any export) / "
                 "`spdflow run` would stop before any export: <n> problem(s) (--dry-run)",
                 "The preflight checks (the SPD1xx errors above, plus SPD104 unless --compile-only) failed; each is "
                 "printed as path:line:col before the message. Nothing was exported or written.",
                 "Fix each listed finding; `spdflow lint` shows the same checks."),
    CatalogEntry("run.model-not-found", "ModelNotFoundError", 1,
                 "model '<id>' is not a directory (relative paths are resolved against '<recipe folder>') / "
                 "is not in the local Hugging Face cache and spdflow does not download / model directory '<dir>' has no config.json",
                 "model.id names no local model; spdflow never uses the network.",
                 "Point model.id at a local HF folder (relative to the recipe), or download the model first."),
    CatalogEntry("run.backend-unavailable", "BackendUnavailableError", 1, "<backend> cannot run here: <reason>",
                 "The backend's runtime or compiler is not installed.", "Install it, or use --compile-only."),
    CatalogEntry("run.stage-failed", "StageError", 1,
                 "stage '<stage>' failed: <ExceptionType>: <first line> / <stage>: cannot <what> (<ExceptionType>: <detail>); <fix>",
                 "A stage raised an unexpected error: corrupt weights, a backend session fault, a full disk (OSError ENOSPC). "
                 "Half-written outputs are removed; the partial report says failed.",
                 "Fix the cause named in the message; rerun (cached stages are reused only when verified). "
                 "--verbose shows the traceback."),
    CatalogEntry("run.prompt", "StageError", 1,
                 "prompt <i> is empty / prompt <i> has <n> tokens but ctx_len <c> leaves room for <c-1>",
                 "A prompt tokenizes to nothing or does not fit in the KV cache.",
                 "Remove empty prompts; raise specialization.ctx_len or shorten the prompt."),
    CatalogEntry("run.tokenizer", "StageError", 1, "model '<name>' has no tokenizer.json in '<dir>'",
                 "spdflow reads the fast-tokenizer file and the model folder has none.",
                 "Save one with tokenizer.save_pretrained()."),
    CatalogEntry("run.report", "StageError", 1, "cannot write the run report in '<dir>': <reason>",
                 "The run finished but its report could not be written (e.g. the disk is full).",
                 "Free space or fix permissions, then rerun: cached stages are reused."),
    CatalogEntry("recipe.outside-path", "PathOutsideRecipeError", 3,
                 "<key> '<path>' resolves to '<resolved>', outside the recipe's folder '<dir>'",
                 "A recipe path leads out of the recipe's folder and --allow-outside-paths was not given.",
                 "Move the file into the recipe's folder, or pass --allow-outside-paths if you trust the recipe."),
    CatalogEntry("run.output-dir", "OutputDirError", 1,
                 "the output dir '<dir>' is an existing file, not a directory / contains a NUL character / "
                 "cannot use the output dir '<dir>': the file system is read-only / permission denied / the disk is full",
                 "The run's `output:` cannot be created or written.", "Set `output:` (or --set output=...) to a writable directory."),
    CatalogEntry("run.output-locked", "OutputDirError", 1,
                 "output dir '<dir>' is in use by another spdflow run (pid <pid>, started <time>: <command>)",
                 "Another spdflow process holds the output dir's advisory lock (`.spdflow.lock`); two runs into one "
                 "directory would overwrite each other's exports. The lock dies with its process, even on kill -9.",
                 "Wait for that run to finish, or give this run another `output:`."),
    CatalogEntry("plugin.load", "PluginError", 4,
                 "unknown <kind> '<name>', and plugin '<plugin>' is broken: <ExceptionType>: <message> / "
                 "implements unknown hook '<hook>' (did you mean '<hook>'?)",
                 "An installed plugin raised (or called sys.exit) on import, or implements a misspelled hook. It is "
                 "unregistered and `spdflow plugins` shows its error; only recipes that use a name it would register fail.",
                 "See `spdflow plugins`; reinstall or fix the plugin."),
    CatalogEntry("plugin.registry", "PluginError", 4,
                 "<kind> '<name>' is registered twice, by plugin '<a>' and by plugin '<b>' / plugin '<p>' failed in <hook>",
                 "Two plugins claim one name (the name is unusable), or a plugin broke while registering (it is "
                 "unregistered whole). Recipes that do not use those names still run.",
                 "Uninstall or fix one of the plugins."),
    CatalogEntry("plugin.unknown-name", "PluginError", 4, "unknown <kind> '<name>'; did you mean '<name>'?",
                 "A name (e.g. a bench K policy) is not registered by any installed plugin.",
                 "Use a name listed in the hint or `spdflow plugins`."),
    CatalogEntry("plugin.proposer", "PluginError", 4,
                 "proposer '<name>' (plugin '<plugin>' <version>) failed[ in <method>]: <ExceptionType>: <message> / failed to start",
                 "The proposer plugin raised while starting or mid-run; the partial report says failed.",
                 "Report it to the plugin's authors (named in the message), or use another proposer."),
    CatalogEntry("plugin.contract", "PluginError", 4,
                 "proposer '<name>' proposed <n> tokens where k_max was <k> / a token id outside the vocabulary / "
                 "returned tokens of dtype <dtype> / draft probabilities with NaN, infinite or negative values / "
                 "acceptor '<name>' returned <tokens> for a proposal of <n> tokens / "
                 "the K policy chose K=<k>, which is not compiled / no plugin implements <hook>",
                 "A plugin returned something that breaks the plugin contract (proposals must be Proposal objects with "
                 "1-D integer ids inside the vocabulary, at most k_max of them, and finite non-negative [n, vocab] "
                 "probabilities; writing into the read-only arrays the engine hands out raises).",
                 "Fix the plugin; the message names it."),
    CatalogEntry("whatif.trace-version", "TraceVersionError", 1,
                 "'<dir>/trace.jsonl' has trace format version <v>, which this spdflow (trace format <n>) cannot read / "
                 "written before replayable traces (version <n>)",
                 "The run was recorded by a newer spdflow, or by one before traces were replayable.",
                 "Upgrade spdflow, or rerun the recipe with this one."),
    CatalogEntry("whatif.run-data", "RunDataError", 1,
                 "'<dir>' is not a finished spdflow run (no <file>) / <file> is unreadable / request <i> has no token ids",
                 "whatif and advise replay a run from its report.json, outputs.jsonl and trace.jsonl; one is missing or damaged.",
                 "Point at the run's output directory (runs/<name>), or rerun the recipe."),
    CatalogEntry("run.lossless", "LosslessError", 5,
                 "--check-lossless: the output of <n> request(s) [<ids>] differs from the greedy no-spec baseline",
                 "Greedy speculative decoding must emit exactly the no-spec tokens; a plugin or the backend changed them. "
                 "The report records the mismatched requests. Sampled runs only record the comparison.",
                 "Find the plugin at fault (try another proposer or acceptor); rerun with --verify to rule out a damaged cache."),
    CatalogEntry("interrupted", "RunInterrupted", 130,
                 "interrupted by the user (Ctrl-C, SIGINT); the partial report is in <dir>/report.json",
                 "Ctrl-C (SIGINT) at any moment, even one a library swallowed or that the shell told the process to "
                 "ignore. The report's status is \"interrupted\"; the previous run's report is never left in place.",
                 "Rerun: finished stages are reused from the cache."),
    CatalogEntry("terminated", "RunTerminated", 143, "terminated (SIGTERM); the partial report is in <dir>/report.json",
                 "SIGTERM (e.g. a CI job cancelled or a container stopped). The report's status is \"interrupted\".",
                 "Rerun: finished stages are reused from the cache."),
    CatalogEntry("sweep.invalid", "RecipeError", 3, "sweep '<path>' is invalid: <n> errors",
                 "The sweep file, or a recipe it expands to, has findings, each printed above as path:line:col "
                 "(prefixed with the point or points it concerns).", "Fix every listed finding; `spdflow lint` shows them too."),
    CatalogEntry("sweep.points-failed", "sweep report", 1, "<n> of <m> points did not finish: <ids>",
                 "Some points failed (or were not run); the others finished and are in sweep.md.",
                 "Read points/<id>/run.log; rerun the sweep to run only those points."),
    CatalogEntry("sweep.executor", "ExecutorUnavailableError", 1,
                 "--executor ray needs Ray, which is not installed here; ... / cannot start or reach the Ray cluster at <addr>",
                 "The executor chosen on the command line cannot run here.",
                 "pip install \"spdflow[ray]\", check --address, or use the local executor."),
    CatalogEntry("sweep.busy", "SpdflowError", 1, "another spdflow sweep is running in <dir>",
                 "Two sweeps would write the same points at once.", "Wait for the other one, or set another output dir."),
    CatalogEntry("sweep.interrupted", "RunInterrupted", 130, "sweep interrupted; finished points are kept in <dir>/points",
                 "Ctrl-C or SIGTERM during a sweep: running points write 'interrupted' reports.",
                 "Rerun the same command: finished points are skipped, the rest run."),
    CatalogEntry("internal", "unexpected exception", 1, "internal error: <ExceptionType>: <message>",
                 "A bug in spdflow: an error that has no one-sentence message yet.",
                 "Rerun with --verbose and report the traceback."),
)

ENTRIES: tuple[CatalogEntry, ...] = FINDINGS + SWEEP_FINDINGS + RUNTIME


def entry(code: str) -> CatalogEntry:
    """The catalogue entry of ``code``; KeyError when it is not documented."""
    for item in ENTRIES:
        if item.code == code:
            return item
    raise KeyError(code)


def _cell(text: str, *, code: bool = False) -> str:
    """One table cell: pipes escaped; <placeholders> kept visible (code span, or &lt;)."""
    text = text.replace("|", "\\|").replace("\n", " ")
    return f"`{text}`" if code else text.replace("<", "&lt;")


def _table(entries: tuple[CatalogEntry, ...], columns: tuple[str, ...]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for item in entries:
        cells = {"code": f"`{item.code}`", "kind": item.error, "error": f"`{item.error}`" if item.error[0].isupper() else item.error,
                 "exit": str(item.exit_code), "message": _cell(item.message, code=True), "cause": _cell(item.cause), "fix": _cell(item.fix)}
        lines.append("| " + " | ".join(cells[c] for c in columns) + " |")
    return lines


def render_markdown() -> str:
    """The text of docs/errors.md."""
    lines = [
        "# Errors and exit codes",
        "",
        "<!-- Generated by `python -m spdflow.catalog > docs/errors.md` from spdflow/catalog.py; do not edit. -->",
        "",
        "Every problem is reported as one sentence (with `path:line:col` for recipe findings) and a hint;",
        "a traceback appears only with `--verbose`.",
        "",
        "## Exit codes",
        "",
        "| exit | meaning |",
        "|---|---|",
        *[f"| {code} | {meaning} |" for code, meaning in EXIT_CODES.items()],
        "",
        "## Recipe findings (`spdflow lint`, `spdflow run`)",
        "",
        "SPD0xx make a recipe invalid (exit 3). SPD1xx are lint rules: warnings exit 0 unless `--strict`, errors exit 1.",
        "",
        *_table(FINDINGS, ("code", "kind", "message", "cause", "fix")),
        "",
        "## Sweep findings (`spdflow sweep`, `spdflow lint`)",
        "",
        "A sweep file's own problems are SPD3xx (errors exit 3, warnings 0); each expanded point is also checked as",
        "a recipe, its findings (above) prefixed with the point or points they concern.",
        "",
        *_table(SWEEP_FINDINGS, ("code", "kind", "message", "cause", "fix")),
        "",
        "## Runtime errors",
        "",
        *_table(RUNTIME, ("code", "error", "exit", "message", "cause", "fix")),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
