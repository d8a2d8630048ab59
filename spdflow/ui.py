"""Terminal progress for runs: stage lines and rich progress bars on stderr."""
from __future__ import annotations

import time

from rich.console import Console
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
            self.console.print(f"[bold]{name}[/bold]: [{style}]{status}[/{style}]" + (f" ({reason})" if reason else ""))

    def message(self, text: str) -> None:
        if not self.quiet:
            self.console.print(f"  [dim]{text}[/dim]")

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {text}")

    def generation(self, total_tokens: int, label: str):
        return _TokenProgress(self.console, total_tokens, label, self.quiet)


class _TokenProgress:
    """A bar over the token budget with live tokens/s."""

    def __init__(self, console: Console, total: int, label: str, quiet: bool):
        self.quiet = quiet
        self.total = total
        self.done = 0
        self.start = time.perf_counter()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} tok/s"), TimeElapsedColumn(),
            console=console, transient=True, disable=quiet,
        )
        self.task = self.progress.add_task(label, total=total, rate="-")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def advance(self, n: int) -> None:
        self.done += n
        elapsed = time.perf_counter() - self.start
        rate = f"{self.done / elapsed:.0f}" if elapsed > 0 else "-"
        self.progress.update(self.task, advance=n, rate=rate)
