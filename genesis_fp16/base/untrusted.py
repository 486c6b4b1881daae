"""State files read as untrusted input: the run manifest, the event log, the
settings, ``.env`` and profile files, the host's precision cache.

`read_untrusted` reads a regular file only (a link only to one): a FIFO, a
device, a directory or a socket is named as such before it is opened, and it
is opened with ``O_NONBLOCK`` (a FIFO swapped in after the check is not
waited on), and at most so many bytes are read. `parse_json` parses strict
JSON (no ``NaN``, ``Infinity`` or number too large to be finite) nested at
most so deep, turning the parser's RecursionError into a problem like any
other; `read_json` is both. Anything wrong is one `UntrustedFileError` (a
`genesis_fp16.base.storage.StorageError`) naming the file, what is wrong and the
fix, or a `JsonProblem` without a path for a caller that names the line.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, Optional, Union

from genesis_fp16.base.storage import FileStamp, PathLike, StorageError, fault_kind

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a FIFO", "a directory", ...), for one that is not a regular file."""
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


class UntrustedFileError(StorageError):
    """A state file that is not what it should be: not a regular file, too
    large, not strict JSON, nested too deep. ``problem`` says what is wrong
    without the path; the message names the file (``what`` and ``path``),
    the problem and ``fix``. ``head``: the file's first bytes when it was
    read (a caller may tell its own file by them), ``stamp`` its `file_stamp`
    then. ``kind`` is ``path`` for what is not a regular file, ``corrupt``
    for its content, else the fault."""

    def __init__(
        self,
        path: PathLike,
        what: str,
        problem: str,
        fix: str,
        kind: str = "corrupt",
        head: bytes = b"",
        stamp: Optional[FileStamp] = None,
    ) -> None:
        self.path, self.what, self.problem, self.fix = Path(path), what, problem, fix
        self.head, self.stamp = head, stamp
        super().__init__(f"{what} {path} {problem}; {fix}" if fix else f"{what} {path} {problem}", kind)


def not_regular(path: PathLike) -> Optional[str]:
    """Why ``path`` cannot be read as a regular file ("is a FIFO (a symlink to
    /x), expected a regular file"; "is a dangling symlink to /x"), or None
    when it is one or nothing is there. Never opens it."""
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be examined ({exc.strerror or exc})"
    via = ""
    if stat.S_ISLNK(lst.st_mode):
        try:
            via = f" (a symlink to {os.readlink(path)})"
        except OSError:
            via = " (a symlink)"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"is a dangling symlink{via}"
    except OSError as exc:
        return f"cannot be examined{via} ({exc.strerror or exc})"
    return None if stat.S_ISREG(st.st_mode) else f"is {file_kind(st.st_mode)}{via}, expected a regular file"


def open_untrusted(path: PathLike, what: str, fix: str) -> int:
    """A read-only descriptor of the regular file ``path``, opened without
    blocking (a FIFO swapped in after the check does not hang the open).
    Raises FileNotFoundError when nothing is there, else `UntrustedFileError`
    for what is not a regular file or cannot be opened."""
    if not os.path.lexists(path):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
    problem = not_regular(path)
    if problem is not None:
        raise UntrustedFileError(path, what, problem, fix, "path")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        problem = f"cannot be opened ({exc.strerror or exc})"
        raise UntrustedFileError(path, what, problem, fix, fault_kind(exc) or "io") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # swapped since the check
        os.close(fd)
        problem = f"changed into {file_kind(mode)} while being opened, expected a regular file"
        raise UntrustedFileError(path, what, problem, fix, "path")
    return fd


def read_untrusted(path: PathLike, what: str, fix: str, max_bytes: int) -> tuple[bytes, FileStamp]:
    """The bytes of the regular file ``path`` (see `open_untrusted`) and its
    `file_stamp` as read; `UntrustedFileError` (its ``head`` the first bytes)
    when it holds more than ``max_bytes``; FileNotFoundError when nothing is there."""
    fd = open_untrusted(path, what, fix)
    try:
        fst = os.fstat(fd)
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or exc})"
        raise UntrustedFileError(path, what, problem, fix, fault_kind(exc) or "io") from None
    finally:
        os.close(fd)
    data, stamp = b"".join(chunks), (fst.st_ino, fst.st_size, fst.st_mtime_ns)
    if len(data) > max_bytes:
        raise UntrustedFileError(path, what, f"is larger than {_size(max_bytes)}", fix, head=data[:4096], stamp=stamp)
    return data, stamp


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 and n % (1024 * 1024) == 0 else f"{n} bytes"


class JsonProblem(ValueError):
    """What `parse_json` found wrong, without a path ("is not valid JSON (...)"). ``torn``: text that is not JSON or
    not UTF-8, as a write cut short leaves (not a value nested too deep)."""

    def __init__(self, message: str, torn: bool = False) -> None:
        super().__init__(message)
        self.torn = torn


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` deep (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def _finite(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text} is not finite")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(data: Union[bytes, str], max_depth: int, *, non_finite: bool = False) -> Any:
    """``data`` as strict JSON: UTF-8, no ``NaN`` or ``Infinity`` and no number
    too large to be finite (``non_finite`` lets them pass, for a log that
    writes them), nested at most ``max_depth`` deep. Raises `JsonProblem`."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text) if non_finite else json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        raise JsonProblem(f"is nested too deep to read (more than {max_depth} levels)") from None
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
        raise JsonProblem(problem, torn=True) from None
    except ValueError as exc:
        raise JsonProblem(f"is not valid JSON ({str(exc).splitlines()[0][:200]})", torn=True) from None
    if too_deep(value, max_depth):
        raise JsonProblem(f"is nested more than {max_depth} levels deep")
    return value


def read_json(path: PathLike, what: str, fix: str, *, max_bytes: int, max_depth: int) -> Any:
    """The file ``path`` read as untrusted strict JSON (`read_untrusted`, `parse_json`);
    one `UntrustedFileError` for anything wrong, FileNotFoundError when nothing is there."""
    data, stamp = read_untrusted(path, what, fix, max_bytes)
    try:
        return parse_json(data, max_depth)
    except JsonProblem as exc:
        raise UntrustedFileError(path, what, str(exc), fix, head=data[:4096], stamp=stamp) from None
