"""The host-level cache of ``auto``'s measured decisions: one JSON file per
user (the setting ``precision_cache``, default
``~/.cache/genesis-fp16/precision.json``), shared by every state dir, read as
untrusted input (issue 44).

Reading never blocks, never reads without bound and never raises: the path
must be a regular file (a symlink only to one; a FIFO, a device, a
directory or a socket is refused before it is opened, and it is opened with
``O_NONBLOCK``), of at most `MAX_BYTES`, strict JSON (no ``Infinity`` or
``NaN``, no number too large to be finite), nested at most `MAX_DEPTH`
deep, with our format marker. Anything else reads as no decisions, with one
warning (``precision.cache_unreadable``) naming the file and what is wrong.
Each entry is then checked by `genesis_fp16.precision.record.parse_record`: its
key the hash of its workload, its workload this one, its verdict what
today's rule takes from its own figures; an entry that fails is absent
(``precision.cache_entry_ignored``) and the workload is measured again.

Writing never touches a file that is not a cache of ours: the file must be
absent or parse as our format (or the first version's), else the write is
refused (`CacheRefused`, an ``OSError``: the decision stands for this run).
Writers hold an exclusive ``flock`` on a side file (``<cache>.lock``) while
they read, merge and replace the file (temp file, fsync, rename), so
concurrent runs keep every entry. `PrecisionCache.forget` (``doctor
--recalibrate``) empties a cache of ours, moves a malformed one of ours
(its marker is in its first bytes) aside to ``<name>.corrupt-<time>``, and
refuses a file that is not ours, naming it: remove it by hand.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Union

from genesis_fp16.precision import calibration as cal
from genesis_fp16.precision import record as calibration_record
from genesis_fp16.base import untrusted
from genesis_fp16.base.storage import atomic_write_text
from genesis_fp16.base.telemetry import get_logger, log_once

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: writers are not serialised
    fcntl = None  # type: ignore[assignment]

CACHE_FORMAT = "genesis-fp16 precision cache"
"""The marker every cache file of ours starts with (``{"format": ...``)."""
CACHE_VERSION = 2
"""Of the file: 2 carries `CACHE_FORMAT`; 1 was ``{"version": 1, "calibrations": ...}`` (still ours: replaced on
write)."""
MAX_BYTES = 4 * 1024 * 1024
"""A larger file is not read (a cache of ours stays under it: the oldest entries go first)."""
MAX_DEPTH = 32
"""Nesting deeper than this is not a cache of ours (ours nests about 8 deep)."""
LOCK_TIMEOUT_S = 10.0
"""How long a writer waits for another one's lock before it gives up (the decision still stands)."""
_HEAD = 4096
_MARKER = f'"format": "{CACHE_FORMAT}"'.encode()
_LOG = "genesis_fp16.precision.cache"
_FIX = "remove or move it by hand, or point GENESIS_FP16_PRECISION_CACHE at another file"


class CacheRefused(OSError):
    """The cache file cannot be written (or cleared): it is not a cache of
    ours, not a regular file, or locked too long. The message names the path,
    what is wrong and what to do; the file is left alone."""


@dataclass
class CacheFile:
    """What `inspect` found at a cache path.

    ``state``: ``absent``; ``ours`` (``records``: the raw entries of this
    version; empty for another version's); ``corrupt`` (ours by its marker,
    but not readable); ``foreign`` (a regular file that is not ours);
    ``unusable`` (not a regular file, or it cannot be opened). ``problem``
    says what is wrong, for all but ``absent`` and a readable ``ours``."""

    path: Path
    state: str
    problem: str = ""
    records: dict[str, Any] = field(default_factory=dict)
    stamp: Optional[tuple[int, int, int]] = None


def _read_bounded(path: Path) -> tuple[Optional[bytes], CacheFile]:
    """The file's bytes (its first ones only when it holds more than `MAX_BYTES`), or None with why not; never blocks
    (`genesis_fp16.base.untrusted.read_untrusted`)."""
    try:
        data, stamp = untrusted.read_untrusted(path, "precision cache", _FIX, MAX_BYTES)
    except FileNotFoundError:
        return None, CacheFile(path, "absent")
    except untrusted.UntrustedFileError as exc:
        if exc.head:  # read, and too large: whether it is ours is told by its first bytes
            return exc.head, CacheFile(path, "ours", exc.problem, stamp=exc.stamp)
        return None, CacheFile(path, "unusable", exc.problem)
    return data, CacheFile(path, "ours", stamp=stamp)


def inspect(path: Union[str, Path]) -> CacheFile:
    """What is at ``path``, read as untrusted input (see the module's doc); never raises, never blocks."""
    path = Path(path)
    data, found = _read_bounded(path)
    if data is None:
        return found
    ours = _MARKER in data[:_HEAD]

    def bad(problem: str) -> CacheFile:
        return CacheFile(path, "corrupt" if ours else "foreign", problem, stamp=found.stamp)

    if found.problem:  # larger than MAX_BYTES
        return bad(found.problem)
    try:
        value = untrusted.parse_json(data, MAX_DEPTH)
    except untrusted.JsonProblem as exc:
        return bad(str(exc))
    if not isinstance(value, dict):
        return bad(f'holds a JSON {type(value).__name__}, expected an object with "format": "{CACHE_FORMAT}"')
    if value.get("format") == CACHE_FORMAT:
        version, records = value.get("version"), value.get("calibrations")
        if isinstance(version, bool) or not isinstance(version, int):
            return CacheFile(path, "corrupt", f"has version {version!r}, expected an integer", stamp=found.stamp)
        if version != CACHE_VERSION:
            return CacheFile(
                path, "ours", stamp=found.stamp
            )  # another version's decisions: absent here, replaced on write
        if not isinstance(records, dict):
            return CacheFile(
                path,
                "corrupt",
                f"has calibrations of type {type(records).__name__}, expected an object",
                stamp=found.stamp,
            )
        return CacheFile(path, "ours", records=records, stamp=found.stamp)
    if set(value) == {"version", "calibrations"} and value["version"] == 1 and isinstance(value["calibrations"], dict):
        return CacheFile(path, "ours", stamp=found.stamp)  # the first version's file: its records are of older versions
    return bad(
        f'has no "format": "{CACHE_FORMAT}" (keys {", ".join(repr(k)[:40] for k in sorted(value)[:8]) or "none"}): '
        "not a genesis-fp16 precision cache"
    )


def fix_hint(found: CacheFile) -> str:
    """What to do about a cache file that cannot be used."""
    if found.state == "corrupt":
        return "`genesis-fp16 doctor --recalibrate` moves it aside, or remove it by hand"
    return _FIX


def _refused(found: CacheFile, doing: str) -> CacheRefused:
    return CacheRefused(f"{found.path} {found.problem}; {doing} refused, the file left alone: {fix_hint(found)}")


class PrecisionCache:
    """Measured ``auto`` decisions per workload key, in one JSON file
    (``{"format": CACHE_FORMAT, "version": 2, "calibrations": {key: record}}``).
    An unreadable file or an entry that fails its checks reads as absent,
    with one warning; see the module's doc."""

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path).expanduser()

    @classmethod
    def from_settings(cls, settings: Optional[Any] = None) -> "PrecisionCache":
        from genesis_fp16.base.settings import load_settings

        return cls((settings or load_settings(check_names=False)).precision_cache)

    def inspect(self) -> CacheFile:
        """What the file is now (`inspect`), without warnings."""
        return inspect(self.path)

    def _read(self) -> CacheFile:
        found = self.inspect()
        if found.state not in ("absent", "ours"):
            log_once(
                get_logger(_LOG),
                f"cache:{found.path}:{found.stamp}:{found.problem}",
                "warning",
                "precision.cache_unreadable",
                path=str(found.path),
                problem=found.problem,
                reason=f"{found.path} {found.problem}; read as no measured decisions, and none is saved there: "
                f"{fix_hint(found)}",
            )
        return found

    @staticmethod
    def _entry(
        key: str, record: Any, described: Optional[dict[str, Any]] = None
    ) -> tuple[Optional[cal.Calibration], str]:
        try:
            return calibration_record.parse_record(record, key=key, described=described), ""
        except calibration_record.RecordError as exc:
            return None, "" if exc.stale else f"{str(key)[:64]!r}: {exc}"

    @staticmethod
    def _ignored(found: CacheFile, problems: list[str]) -> None:
        if problems:
            shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
            log_once(
                get_logger(_LOG),
                f"entry:{found.path}:{found.stamp}:{shown}",
                "warning",
                "precision.cache_entry_ignored",
                path=str(found.path),
                entries=len(problems),
                problem=shown,
                reason=f"{found.path}: {len(problems)} entr{'y' if len(problems) == 1 else 'ies'} not used ({shown}); "
                "each such workload is measured again and its entry replaced",
            )

    def get(self, key: str, described: Optional[dict[str, Any]] = None) -> Optional[cal.Calibration]:
        """This workload's calibration (``described``: its `genesis_fp16.precision.calibration.workload`, checked
        against the entry's when given), or None: absent, unreadable, or failing its checks."""
        found = self._read()
        if key not in found.records:
            return None
        calibration, problem = self._entry(key, found.records[key], described)
        self._ignored(found, [problem] if problem else [])
        return calibration

    def all(self) -> list[cal.Calibration]:
        """Every entry that passes its checks, oldest first."""
        found = self._read()
        checked = [self._entry(k, r) for k, r in found.records.items()]
        self._ignored(found, [problem for _, problem in checked if problem])
        return sorted((c for c, _ in checked if c is not None), key=lambda c: (c.at, c.key))

    def _target(self, allowed: tuple[str, ...], doing: str) -> Path:
        """The file to write, checked before any lock file is made beside it: the
        path, or the regular file a symlink there points to (the link stays)."""
        found = self.inspect()
        if found.state not in allowed:
            raise _refused(found, doing)
        return Path(os.path.realpath(self.path))

    def put(self, calibration: cal.Calibration) -> None:
        """Add (or replace) one entry: under the lock, read the file, keep its
        valid entries, add this one, replace the file atomically. Raises
        `CacheRefused` (the file is left alone) or another ``OSError``."""
        doing = "saving the measured decision"
        if untrusted.too_deep(calibration.as_record(), MAX_DEPTH - 3):  # the file nests it 2 deep; it must read back
            raise CacheRefused(
                f"the workload {calibration.key} is nested too deep (its batch) to be kept in {self.path}; it is "
                "measured on each run"
            )
        target = self._target(("absent", "ours"), doing)
        target.parent.mkdir(parents=True, exist_ok=True)
        with _Lock(target.with_name(target.name + ".lock")):
            found = inspect(target)
            if found.state not in ("absent", "ours"):
                raise _refused(found, doing)
            records: dict[str, Any] = {}
            for key, record in found.records.items():
                kept, _ = self._entry(key, record)
                if kept is not None:  # one that fails its checks reads as absent: dropped, its workload measured again
                    records[key] = kept.as_record()
            records[calibration.key] = calibration.as_record()
            _write(target, records)

    def forget(self) -> "Forgotten":
        """Forget every decision (``doctor --recalibrate``): a cache of ours is
        emptied; a malformed one of ours is moved aside to
        ``<name>.corrupt-<time>``; anything else raises `CacheRefused`, the file left alone."""
        doing = "forgetting the decisions"
        target = self._target(("absent", "ours", "corrupt"), doing)
        if not target.parent.is_dir():
            return Forgotten(0)
        with _Lock(target.with_name(target.name + ".lock")):
            found = inspect(target)
            if found.state == "absent":
                return Forgotten(0)
            if found.state == "ours":
                _write(target, {})
                return Forgotten(len(found.records))
            if found.state != "corrupt":
                raise _refused(found, doing)
            base = f"{target.name}.corrupt-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
            aside, n = target.with_name(base), 0
            while aside.exists() or aside.is_symlink():
                n += 1
                aside = target.with_name(f"{base}.{n}")
            os.rename(target, aside)
            _write(target, {})  # an empty cache in its place (a symlink to it keeps working)
            get_logger(_LOG).warning(
                "precision.cache_moved_aside",
                path=str(found.path),
                to=str(aside),
                problem=found.problem,
                reason=f"{found.path} {found.problem}; moved aside to {aside} (nothing deleted): inspect or remove it "
                "by hand",
            )
            return Forgotten(0, aside, found.problem)

    def clear(self) -> int:
        """Forget every decision (`forget`); returns how many there were."""
        return self.forget().count


@dataclass(frozen=True)
class Forgotten:
    """What `PrecisionCache.forget` did: how many decisions it forgot, and where a malformed file went."""

    count: int
    moved_aside: Optional[Path] = None
    problem: str = ""


def _write(target: Path, records: dict[str, Any]) -> None:
    """Replace ``target`` with a cache holding ``records`` (the oldest dropped past `MAX_BYTES`): temp file, fsync,
    rename."""
    kept = dict(sorted(records.items()))
    while True:
        text = json.dumps(
            {"format": CACHE_FORMAT, "version": CACHE_VERSION, "calibrations": kept}, indent=1, allow_nan=False
        )
        if len(text.encode()) <= MAX_BYTES or not kept:
            break
        oldest = min(kept, key=lambda k: (str(kept[k].get("at")), k))
        del kept[oldest]
    atomic_write_text(target, text + "\n")


class _Lock:
    """An exclusive ``flock`` on a side file, waited for at most `LOCK_TIMEOUT_S`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: Optional[int] = None

    def __enter__(self) -> "_Lock":
        if fcntl is None:  # pragma: no cover
            return self
        flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            what = "is a symlink" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror or exc})"
            raise CacheRefused(f"the cache's lock file {self.path} {what}; remove it by hand") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CacheRefused(f"the cache's lock file {self.path} is not a regular file; remove it by hand")
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise CacheRefused(
                        f"the cache {self.path.with_suffix('')} is locked by another process for {LOCK_TIMEOUT_S:.0f} "
                        "s "
                        f"({self.path}); try again when it ends"
                    ) from None
                time.sleep(0.01)
        self.fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None
