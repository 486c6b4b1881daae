"""Storage checks and storage faults, shared by the ledger, the replay buffer
and the CLIs.

* `prepare_dir` validates (and creates) a directory such as the state
  dir, with one clear message for a file, a dangling symlink, a parent that is
  a file, or a directory that cannot be written.
* `check_output_path` checks an output file path before a long command
  starts, so a bad ``--json``/``--checkpoint`` does not lose the run.
* `fault_kind` sorts a failure (SQLite or OS) into ``corrupt``,
  ``read_only``, ``full``, ``permission``, ``locked`` or ``io``, so a healthy
  read-only file is never called corrupt.
* `retry_locked` is the one retry policy for a locked SQLite database (the
  rollout ledger and the replay buffer both use it).
* `connect_read_only` and `connect_for_reading` open an SQLite file for
  reading where it cannot be written (a read-only directory, a full disk).

State files read as untrusted input (a regular file, size and depth limits,
strict JSON) are read by `genesis_fp16.base.untrusted`.

Whether a path is writable is asked in one place, `can_write` (tests
patch it: as root, ``chmod`` does not stop a write).
"""

from __future__ import annotations

import errno
import io
import os
import sqlite3
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union
from urllib.parse import quote

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

PathLike = Union[str, "os.PathLike[str]"]

# kinds of fault; "path" is a path that cannot be used (a file where a directory is expected)
KINDS = ("path", "corrupt", "read_only", "full", "permission", "locked", "io")


class StorageError(RuntimeError):
    """A storage problem; ``kind`` is one of `KINDS`. The message names
    the path, what is wrong and what to do."""

    def __init__(self, message: str, kind: str = "io") -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def exit_code(self) -> int:
        """2 for what the user must fix in their input (a path, a corrupt file),
        1 for a fault of the machine (read-only, full, permission, locked, I/O)."""
        return 2 if self.kind in ("path", "corrupt") else 1


FileStamp = tuple[int, int, int]


def file_stamp(path: PathLike) -> Optional[FileStamp]:
    """(inode, size, modification time in ns) of a regular file, None when
    there is none: what a read cache compares to know the file changed
    (a rewrite, an atomic replace and an append each change one of them)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def can_write(path: PathLike) -> bool:
    """Whether this process may write ``path`` (an existing file or directory)."""
    return os.access(path, os.W_OK)


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _existing_ancestor(path: Path) -> Path:
    """``path`` itself or its nearest ancestor that exists (or is a symlink)."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(".")


def _unwritable(path: PathLike) -> Optional[tuple[str, str]]:
    """(kind, reason) when ``path`` (or, when it does not exist, its nearest
    existing ancestor) cannot be written; None when it can."""
    target = _existing_ancestor(Path(path))
    if can_write(target):
        return None
    if _read_only_fs(target):
        return "read_only", f"{target} is on a read-only file system"
    try:
        mode = stat.filemode(target.stat().st_mode)
    except OSError:
        mode = "unknown mode"
    return "permission", f"{target} is not writable by this user ({mode})"


def unwritable_reason(path: PathLike) -> Optional[str]:
    """Why ``path`` (or, when it does not exist, its nearest existing
    ancestor) cannot be written, or None when it can."""
    found = _unwritable(path)
    return found[1] if found else None


def _subject(path: Path, name: Optional[str]) -> str:
    """How messages name a directory: ``GENESIS_FP16_STATE_DIR=/x`` or ``directory /x``."""
    if name is None:
        return f"directory {path}"
    return f"{name}={path}" if name.isupper() else f"{name} {path}"


def prepare_dir(path: PathLike, *, name: Optional[str] = None, create: bool = True, writable: bool = True) -> Path:
    """Check that ``path`` is (or can become) a usable directory; create it
    when ``create``; with ``writable``, also that this process can write it.
    ``name`` is how the user gave it (``GENESIS_FP16_STATE_DIR``, ``--out``).
    Raises `StorageError`."""
    path = Path(path)
    subject = _subject(path, name)
    if path.is_symlink() and not path.exists():
        raise StorageError(
            f"{subject} is a dangling symlink to {os.readlink(path)}; create that directory or point it at an "
            "existing one",
            "path",
        )
    if path.exists() and not path.is_dir():
        raise StorageError(
            f"{subject} is a file, expected a directory; point it at a directory or remove the file", "path"
        )
    if not path.exists():
        ancestor = _existing_ancestor(path.parent)
        if ancestor.is_symlink() and not ancestor.exists():
            raise StorageError(
                f"{subject}: parent {ancestor} is a dangling symlink to {os.readlink(ancestor)}; "
                "create that directory or point it elsewhere",
                "path",
            )
        if not ancestor.is_dir():
            raise StorageError(
                f"{subject}: parent {ancestor} is not a directory; point it at a path under a directory", "path"
            )
        if not create:
            if writable and (found := _unwritable(ancestor)):
                raise StorageError(f"{subject} cannot be created: {found[1]}; point it at a writable place", found[0])
            return path
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            kind = fault_kind(exc) or "io"
            raise StorageError(
                f"{subject} cannot be created ({exc.strerror or exc}); point it at a writable place", kind
            ) from None
    if writable and (found := _unwritable(path)):
        raise StorageError(f"{subject} is not writable: {found[1]}; point it at a writable directory", found[0])
    return path


def check_output_path(path: PathLike, what: str, *, directory: bool = False) -> Path:
    """Check, before any work, that an output can be written at ``path``:
    not a directory (or, with ``directory``, not a file), not under a file,
    its nearest existing parent writable. ``what`` is the option (``--json``).
    Creates nothing. Raises `StorageError` (kind ``path``)."""
    path = Path(path)
    if directory:
        try:
            return prepare_dir(path, name=what, create=False)
        except StorageError as exc:
            raise StorageError(str(exc), "path") from None
    if path.is_dir():
        raise StorageError(f"{what} {path} is a directory; expected a file path, e.g. {path / 'out'}", "path")
    ancestor = _existing_ancestor(path.parent)
    if ancestor.is_symlink() and not ancestor.exists():
        raise StorageError(
            f"{what} {path}: {ancestor} is a dangling symlink to {os.readlink(ancestor)}; choose another path", "path"
        )
    if not ancestor.is_dir():
        raise StorageError(
            f"{what} {path}: {ancestor} is a file, not a directory; choose a path in a directory", "path"
        )
    reason = unwritable_reason(ancestor)
    if reason is not None:
        raise StorageError(f"{what} {path}: directory {reason}; choose a writable place", "path")
    return path


# -- classification -------------------------------------------------------------------

# SQLite primary result codes (https://www.sqlite.org/rescode.html)
_SQLITE_KINDS = {
    3: "permission",  # SQLITE_PERM
    5: "locked",  # SQLITE_BUSY
    6: "locked",  # SQLITE_LOCKED
    8: "read_only",  # SQLITE_READONLY
    10: "io",  # SQLITE_IOERR
    11: "corrupt",  # SQLITE_CORRUPT
    13: "full",  # SQLITE_FULL
    14: "io",  # SQLITE_CANTOPEN: refined by `fault_kind` from the file system
    23: "permission",  # SQLITE_AUTH
    26: "corrupt",  # SQLITE_NOTADB
}
_OS_KINDS = {
    errno.ENOSPC: "full",
    errno.EDQUOT: "full",
    errno.EROFS: "read_only",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
}


def _sqlite_kind(exc: sqlite3.Error) -> Optional[str]:
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return _SQLITE_KINDS.get(code & 0xFF)
    text = str(exc).lower()  # older Pythons: SQLite's fixed messages
    for needle, kind in (
        ("locked", "locked"),
        ("busy", "locked"),
        ("readonly", "read_only"),
        ("disk is full", "full"),
        ("not a database", "corrupt"),
        ("malformed", "corrupt"),
        ("disk i/o", "io"),
        ("unable to open", "io"),
    ):
        if needle in text:
            return kind
    return None


def fault_kind(exc: BaseException, path: Optional[PathLike] = None) -> Optional[str]:
    """The kind of storage fault behind ``exc`` (following ``__cause__`` and
    ``__context__``: ``torch.save`` on a full disk raises a RuntimeError whose
    context is the ENOSPC), or None when it is not a storage fault. With
    ``path``, an SQLite "unable to open" is refined by looking at the file."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StorageError):
            return current.kind
        if isinstance(current, sqlite3.Error):
            kind = _sqlite_kind(current)
            if kind == "io" and path is not None and "unable to open" in str(current):
                found = _unwritable(Path(path).parent)
                return found[0] if found else "io"
            if kind == "io" and path is not None and _out_of_space(path):
                return "full"
            if kind is not None:
                return kind
        if isinstance(current, OSError) and current.errno is not None:
            return _OS_KINDS.get(current.errno, "io")
        current = current.__cause__ or current.__context__
    return None


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite saying the database is busy or locked."""
    return isinstance(exc, sqlite3.OperationalError) and _sqlite_kind(exc) == "locked"


_F = TypeVar("_F", bound=Callable[..., Any])

# SQLite's busy timeout handles most contention; this covers the cases it does
# not (a lock held past the timeout, WAL recovery after a crashed writer). The
# wait is jittered so that processes which collided do not retry in step.
retry_locked: Callable[[_F], _F] = retry(
    retry=retry_if_exception(is_locked),
    wait=wait_random_exponential(multiplier=0.05, max=1.0),
    stop=stop_after_attempt(12),
    reraise=True,
)


# SQLite reports some writes that failed for lack of space as SQLITE_IOERR, not
# SQLITE_FULL: growing the WAL index (-shm, 32 KiB at a time) and fsync on some
# file systems. An I/O error where less than this is left is taken as a full disk.
NEARLY_FULL_BYTES = 1024 * 1024


def _out_of_space(path: PathLike) -> bool:
    """Whether the file system that holds ``path`` has (almost) no space left."""
    try:
        found = os.statvfs(_existing_ancestor(Path(path).parent))
    except OSError:
        return False
    return found.f_bavail * found.f_frsize < NEARLY_FULL_BYTES


def full_disk(path: PathLike, exc: BaseException) -> bool:
    """Whether writing ``path`` failed for lack of space: an ENOSPC (or
    SQLITE_FULL) in the chain, or (almost) no free space left where ``path``
    goes."""
    return fault_kind(exc, path) == "full" or _out_of_space(path)


def describe(kind: str, what: str, path: PathLike, detail: object, lost: str = "") -> str:
    """One message for a fault of ``kind`` on ``what`` at ``path``: what is
    wrong, what was ``lost`` (when the caller knows), what to do."""
    subject = f"{what} {path}"
    problem, advice = {
        "read_only": (
            f"{subject} is read-only: {detail}",
            "reads still work; writes need a writable file and directory (check the mount and the permissions)",
        ),
        "full": (f"{subject}: the disk is full ({detail})", "free space and run again"),
        "permission": (
            f"{subject}: permission denied ({detail})",
            "check the owner and mode of the file and its directory",
        ),
        "locked": (f"{subject} stayed locked by another process ({detail})", "retry when it finishes"),
        "io": (f"{subject}: I/O error ({detail})", "check the disk (dmesg) before trusting the file"),
    }[kind]
    return "; ".join(part for part in (problem, lost, advice) if part)


def connect_read_only(path: PathLike, timeout: float = 10.0) -> sqlite3.Connection:
    """A read-only connection to an existing SQLite file. A WAL database needs
    its ``-shm`` file, which cannot be created in a read-only directory nor
    sized on a full disk; then the file is opened ``immutable`` (nobody can
    write it there either; what a writer that died left in its ``-wal`` file
    is not seen until a write is possible again)."""
    uri = "file:" + quote(str(Path(path).resolve()))
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=timeout, isolation_level=None)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        if not _no_shared_memory(path, exc):
            raise
    return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=timeout, isolation_level=None)


def _no_shared_memory(path: PathLike, exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is SQLite failing to make a WAL database's ``-shm`` file: a read-only directory, a full disk."""
    kind = fault_kind(exc, path)
    return (kind in ("io", "read_only") and unwritable_reason(Path(path).parent) is not None) or kind == "full"


def connect_for_reading(path: PathLike, timeout: float = 10.0) -> sqlite3.Connection:
    """A connection to read the existing SQLite file ``path`` that this
    process may write: an ordinary one, or on a full disk (where WAL cannot
    make its ``-shm`` file) the read-only one of `connect_read_only`, so reads
    work on a full disk as in a read-only directory."""
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        if not _no_shared_memory(path, exc):
            raise
    return connect_read_only(path, timeout)


# -- atomic writes: a temp file, fsync, rename ------------------------------------------------------
def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files 0600; a finished file gets the mode open() would give.
_FILE_MODE = 0o666 & ~_read_umask()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: PathLike, write: Callable[[io.BufferedWriter], None]) -> Path:
    """Write a file atomically: ``write`` fills a temp file that replaces
    ``path`` only once it is complete and on disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if hasattr(os, "fchmod"):
                os.fchmod(fh.fileno(), _FILE_MODE)
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda fh: fh.write(data))


def atomic_write_text(path: PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))
