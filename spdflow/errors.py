"""One exception hierarchy; each error knows its exit code.

Exit codes (documented in README.md, tested in tests/test_cli.py):
0 ok, 1 run or lint failure, 2 usage, 3 invalid recipe, 4 plugin fault, 5 lossless check failed,
130 interrupted (SIGINT), 143 terminated (SIGTERM).
"""
from __future__ import annotations

#: every exit code the ``spdflow`` command uses, and what it means (README and catalog print these)
EXIT_CODES = {0: "ok", 1: "run failed or lint findings", 2: "usage error", 3: "invalid recipe",
              4: "plugin fault", 5: "lossless check failed (greedy output differs from no-spec)",
              130: "interrupted (Ctrl-C, SIGINT)", 143: "terminated (SIGTERM)"}


class SpdflowError(Exception):
    """Base of every error spdflow reports to a user as one sentence."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(SpdflowError):
    """The command line was wrong (bad flag value, bad --set)."""

    exit_code = 2


class RecipeError(SpdflowError):
    """The recipe cannot be read or does not validate; carries every finding."""

    exit_code = 3

    def __init__(self, message: str, *, findings=None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.findings = list(findings or [])


class PluginError(SpdflowError):
    """A plugin failed to load or broke the plugin contract."""

    exit_code = 4


class StageError(SpdflowError):
    """A stage (export, compile, generation, ...) failed at run time."""

    exit_code = 1


class PreflightError(StageError):
    """Checks before any export found problems (missing model or prompt file, prompt too long,
    uncovered shapes, backend not runnable); carries them as located findings."""

    def __init__(self, message: str, *, findings=None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.findings = list(findings or [])


class BackendUnavailableError(StageError):
    """The backend's runtime or compiler is not installed on this machine."""


class ExecutorUnavailableError(SpdflowError):
    """The sweep executor named on the command line cannot run here (Ray missing or unreachable)."""

    exit_code = 1


class RunDataError(SpdflowError):
    """A run directory cannot be replayed or priced (``spdflow whatif`` / ``advise``): files
    missing, unreadable, or from a trace format this spdflow does not know."""

    exit_code = 1


class TraceVersionError(RunDataError):
    """trace.jsonl has a format version this spdflow cannot read."""


class LosslessError(SpdflowError):
    """``--check-lossless`` found greedy speculative output that differs from no-spec."""

    exit_code = 5


class RunInterrupted(SpdflowError):
    """The user pressed Ctrl-C (SIGINT); the report says interrupted."""

    exit_code = 130


class RunTerminated(RunInterrupted):
    """The run got SIGTERM; the report says interrupted."""

    exit_code = 143
