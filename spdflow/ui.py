"""Terminal progress for runs: stage lines and rich progress bars on stderr."""
from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

_STYLE = {"ran": "green", "cached": "cyan", "failed": "bold red", "skipped": "yellow", "not_run": "dim"}


class RichUI:
    """Progress and stage lines on stderr; silent when ``quiet``."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.console = Console(stderr=True, highlight=False)

    def stage(self, name: str, status: str, reason: str = "") -> None:
        if not self.quiet:
            style = _STYLE.get(status, "")
            self.console.print(f"[bold]{name}[/bold]: [{style}]{status}[/{style}]" + (f" ({escape(reason)})" if reason else ""),
                               highlight=False)

    def message(self, text: str) -> None:
        """A step inside a long stage (export: load, trace, write; compile: each specialization)."""
        if not self.quiet:
            self.console.print(f"  [dim]{escape(text)}[/dim]", highlight=False)

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {escape(text)}", highlight=False)

    def generation(self, total_tokens: int, label: str):
        return _TokenProgress(self.console, total_tokens, label, self.quiet)


class _TokenProgress:
    """A bar over the token budget with live tokens/s on a terminal; elsewhere (CI logs, pipes)
    a plain line at every quarter of the budget and none blank."""

    def __init__(self, console: Console, total: int, label: str, quiet: bool):
        self.quiet = quiet
        self.console = console
        self.label = label
        self.total = total
        self.done = 0
        self.start = time.perf_counter()
        self.plain = not console.is_terminal
        self.next_report = 0.25
        self.progress = None
        if not self.plain:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]} tok/s"), TimeElapsedColumn(),
                console=console, transient=True, disable=quiet,
            )
            self.task = self.progress.add_task(label, total=total, rate="-")

    def __enter__(self):
        if self.progress is not None:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            return self.progress.__exit__(*exc)
        return False

    def _rate(self) -> str:
        elapsed = time.perf_counter() - self.start
        return f"{self.done / elapsed:.0f}" if elapsed > 0 else "-"

    def advance(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress.update(self.task, advance=n, rate=self._rate())
            return
        if not self.quiet and self.total and self.done >= self.next_report * self.total:
            while self.next_report * self.total <= self.done:
                self.next_report += 0.25
            self.console.print(f"  {self.label}: {min(self.done, self.total)}/{self.total} tokens budgeted "
                               f"({min(self.done / self.total, 1):.0%}), {self._rate()} tok/s", highlight=False)
