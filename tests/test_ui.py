"""Terminal progress: plain lines when stderr is not a terminal, never a blank line."""
from __future__ import annotations

import io

from rich.console import Console

from spdflow.ui import RichUI


def ui_writing_to(buffer: io.StringIO, terminal: bool = False) -> RichUI:
    ui = RichUI()
    ui.console = Console(file=buffer, force_terminal=terminal, width=100)
    return ui


def test_generation_progress_is_a_few_plain_lines_off_a_terminal():
    buffer = io.StringIO()
    ui = ui_writing_to(buffer)
    with ui.generation(100, "generate") as bar:
        for _ in range(50):
            bar.advance(2)
    lines = buffer.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [f"  generate: {n}/100 tokens budgeted ({n}%)" for n in (26, 50, 76, 100)]
    assert "" not in lines


def test_messages_with_brackets_are_printed_as_written():
    buffer = io.StringIO()
    ui = ui_writing_to(buffer)
    ui.message("specialization 2/3: decode ks=[0, 4]")
    ui.stage("compile", "ran", "K-list [0, 4]")
    assert buffer.getvalue() == "  specialization 2/3: decode ks=[0, 4]\ncompile: ran (K-list [0, 4])\n"


def test_quiet_prints_no_progress():
    buffer = io.StringIO()
    ui = ui_writing_to(buffer)
    ui.quiet = True
    with ui.generation(10, "generate") as bar:
        bar.advance(10)
    ui.message("loading")
    assert buffer.getvalue() == ""
