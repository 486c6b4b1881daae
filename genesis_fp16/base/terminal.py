"""The rich consoles every command prints through.

On a terminal rich fits output to the window. Written to a pipe or a file,
rich would assume 80 columns and wrap or cut table cells (a timestamp in
``rollout status``, a reason) for a reader that has no window at all; there
these consoles are `PIPE_WIDTH` wide and do not wrap text, so what is
captured is what was printed. An explicit width (``COLUMNS``, ``width=``)
still wins.
"""

from __future__ import annotations

from typing import Any, Tuple

from rich import table as rich_table
from rich.console import Console, ConsoleDimensions

# wide enough for any row this project prints; tables take only the room they need
PIPE_WIDTH = 10_000


class WideWhenPiped(Console):
    """A `rich.console.Console` as wide as `PIPE_WIDTH` when its
    output is not a terminal. Decided at each print, not when it was made:
    the module-level consoles outlive a test runner's swapped streams."""

    @property
    def size(self) -> ConsoleDimensions:
        dims = Console.size.fget(self)  # type: ignore[attr-defined]
        if self._width is None and not self.is_terminal:
            return ConsoleDimensions(PIPE_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size: Tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


def make_console(*, stderr: bool = False, **options: Any) -> Console:
    """A console on stdout (results) or stderr (progress, logs, errors) that
    never wraps text and is wide when piped."""
    options.setdefault("soft_wrap", True)
    return WideWhenPiped(stderr=stderr, **options)


class Table(rich_table.Table):
    """The tables commands print: a `rich.table.Table` whose columns fold a
    value that does not fit onto the next lines (``overflow="fold"``) instead
    of cutting it with an ellipsis, so a path, an id or a long word is shown
    whole at any width (a narrow terminal, ``COLUMNS=80``). A column asks for
    another overflow by name."""

    def add_column(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)
