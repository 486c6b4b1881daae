"""The consoles commands print through: wide and unwrapped when piped, the
window's width on a terminal, an explicit width kept."""

from __future__ import annotations

import io

from rich.table import Table

from genesis_fp16.base.terminal import PIPE_WIDTH, make_console


def _table(cell: str) -> Table:
    table = Table()
    table.add_column("value")
    table.add_row(cell)
    return table


def test_piped_console_neither_wraps_nor_cuts_a_long_cell():
    buf = io.StringIO()
    console = make_console(file=buf)
    cell = "2026-11-25T03:14:44.014106+00:00 " * 8
    console.print(_table(cell.strip()))
    assert console.width == PIPE_WIDTH
    assert cell.strip() in buf.getvalue()


def test_terminal_and_explicit_widths_are_kept():
    assert make_console(file=io.StringIO(), force_terminal=True, width=60).width == 60
    assert make_console(file=io.StringIO(), width=70).width == 70
    buf = io.StringIO()
    make_console(file=buf, width=40).print(_table("x" * 100))
    assert "x" * 100 not in buf.getvalue()  # at 40 columns the cell wraps, as asked


def test_the_commands_table_folds_a_long_value_instead_of_cutting_it():
    from genesis_fp16.base.terminal import Table as FoldingTable

    path = "/state/" + "a-very-long-folder-name-" * 6 + "precision.json"
    table = FoldingTable()
    table.add_column("variable")
    table.add_column("value")
    table.add_row("GENESIS_FP16_PRECISION_CACHE", path)
    buf = io.StringIO()
    make_console(file=buf, width=60).print(table)
    lines = buf.getvalue().splitlines()
    assert "…" not in buf.getvalue() and max(map(len, lines)) <= 60
    assert "".join(line.split("│")[2].strip() for line in lines if line.startswith("│")) == path
