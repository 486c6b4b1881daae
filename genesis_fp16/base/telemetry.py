"""structlog set-up and the event sink.

One configuration for the whole process: machines read JSON lines appended to
``<state_dir>/events.jsonl`` (events at or above ``log_level``, default INFO),
people read the console renderer on stderr (events at or above
``console_log_level``, default WARNING; ``genesis-fp16 -v`` shows INFO). The
file sink runs before the console filter, so a quiet terminal never thins the
file that ``tune`` and audits read. Event names are dotted
(``trainer.step_skipped``); docs/EVENTS.md lists them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Optional

import structlog

try:  # POSIX: appenders in other processes and rotation exclude each other
    import fcntl
except ImportError:  # Windows: rotation is safe between threads of one process only
    fcntl = None  # type: ignore[assignment]

from genesis_fp16.base import untrusted
from genesis_fp16.base.settings import LogFormat, LogLevel, Settings

_LOCK = threading.Lock()
_CONFIGURED: dict[str, Any] = {}
_ONCE_KEYS: set[str] = set()
# the console level asked for on the command line (`genesis-fp16 -v`); None: the settings decide
_CONSOLE_OVERRIDE: dict[str, Optional[LogLevel]] = {"level": None}
# processors that see every event after the JSON-lines file (add_sink: TensorBoard scalars)
_SINKS: list[Callable[[Any, str, dict[str, Any]], dict[str, Any]]] = []

# structlog's method names (and the level names add_log_level writes) -> numbers
_LEVEL_NUMBERS = {
    "debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
    "error": logging.ERROR, "exception": logging.ERROR, "critical": logging.CRITICAL, "fatal": logging.CRITICAL,
}  # fmt: skip

EventListener = Callable[[str, dict[str, Any]], None]

# C0 and C1 control characters (ESC starts terminal escape sequences), DEL, and
# the Unicode bidirectional overrides that reorder what a terminal shows
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape_control(match: "re.Match[str]") -> str:
    char = match.group()
    code = ord(char)
    return _SHORT_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def visible_controls(text: str) -> str:
    """``text`` with every control character written as a visible escape
    (``\\x1b``, ``\\x07``, ``\\u202e``), so text from users or files cannot
    move the cursor, recolour or rewrite the terminal."""
    return _CONTROL.sub(_escape_control, text)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "value") and isinstance(getattr(value, "value"), (str, int, float)):
        return value.value
    return repr(value)


def _level_number(method: str, event_dict: dict[str, Any]) -> int:
    return _LEVEL_NUMBERS.get(str(event_dict.get("level", method)).lower(), logging.INFO)


# one lock for every sink in this process: after a re-configuration old and
# new loggers may append to the same file
_WRITE_LOCK = threading.Lock()


def rotated_files(path: Path) -> list[Path]:
    """The rotated logs of ``path`` that exist (``events.jsonl.1``, ``.2``, ...), newest first."""
    path = Path(path)
    pattern = re.compile(re.escape(path.name) + r"\.([0-9]+)")
    if not path.parent.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in path.parent.iterdir() if (m := pattern.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def _append(path: Path, data: bytes) -> None:
    """One ``O_APPEND`` write per line: appenders in other processes never tear it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class _RotationLock:
    """An exclusive ``flock`` on ``<log>.lock`` around size check, rotation and
    append, so processes sharing the log neither rotate it twice nor write to a
    file another one is renaming, and the size cap holds exactly."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)  # releases the lock


class JsonlSink:
    """A processor that appends every event at or above ``level`` as one JSON
    line to a file, then passes the event on unchanged. Each line is one
    ``O_APPEND`` write under a lock, so concurrent threads and processes never
    interleave lines.

    With ``max_bytes`` > 0 the file is rotated before a line would take it
    past that size: ``events.jsonl.1`` becomes ``.2`` and so on, at most
    ``keep`` rotated files are kept (older ones are deleted), and
    ``events.jsonl`` becomes ``events.jsonl.1``, every step an ``os.replace``.
    Check, rotation and append happen under ``flock`` on ``<log>.lock``
    (POSIX; on other systems under a lock of this process only), so every
    line lands whole in one file and only one process rotates."""

    def __init__(self, path: Path, level: int = logging.INFO, *, max_bytes: int = 0, keep: int = 3) -> None:
        if max_bytes < 0 or keep < 1:
            raise ValueError(
                f"JsonlSink needs max_bytes >= 0 (0: no rotation) and keep >= 1, got {max_bytes} and {keep}"
            )
        self.path = Path(path)
        self.level = level
        self.max_bytes = max_bytes
        self.keep = keep

    def __call__(self, logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        if _level_number(method, event_dict) < self.level:
            return event_dict
        record = {k: _jsonable(v) for k, v in event_dict.items()}
        record.setdefault("pid", os.getpid())
        data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        with _WRITE_LOCK:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if not self.max_bytes:
                    _append(self.path, data)
                    return event_dict
                with _RotationLock(self.path.with_name(self.path.name + ".lock")):
                    if self._full(len(data)):
                        self._rotate()
                    _append(self.path, data)
            except OSError as exc:  # the console still shows the event
                sys.stderr.write(f"genesis-fp16: cannot write event log {self.path}: {exc}\n")
        return event_dict

    def _full(self, adding: int) -> bool:
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return False
        return size > 0 and size + adding > self.max_bytes

    def _rotate(self) -> None:
        def nth(i: int) -> Path:
            return self.path.with_name(f"{self.path.name}.{i}")

        for old in rotated_files(self.path):  # also what a larger keep left behind
            if int(old.name.rsplit(".", 1)[1]) >= self.keep:
                old.unlink(missing_ok=True)
        for i in range(self.keep - 1, 0, -1):
            if nth(i).exists():
                os.replace(nth(i), nth(i + 1))
        os.replace(self.path, nth(1))


class ConsoleLevelFilter:
    """A processor that drops events under the console level. It runs after
    the JSON-lines sink: the file has already kept what the terminal hides."""

    def __init__(self, level: int) -> None:
        self.level = level

    def __call__(self, logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        if _level_number(method, event_dict) < self.level:
            raise structlog.DropEvent
        return event_dict


def _visible_values(logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Control characters in string values shown as escapes on the console (a
    reason or an agent name with ESC in it must not recolour the terminal; the
    JSON renderer escapes them by itself)."""
    return {k: visible_controls(v) if isinstance(v, str) else v for k, v in event_dict.items()}


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of the write, so output
    follows a test runner's or typer's CliRunner's swapped stream instead of
    the one that was current when logging was configured."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_STDERR = _CurrentStderr()


def console_level(settings: Settings) -> LogLevel:
    """The console level in effect: the more verbose of the command line's
    (``-v``) and the settings' ``console_log_level``."""
    asked = _CONSOLE_OVERRIDE["level"]
    configured = settings.console_log_level
    if asked is None:
        return configured
    return min(asked, configured, key=lambda lv: getattr(logging, lv.value))


def set_console_level(level: Optional[LogLevel]) -> None:
    """Show events at or above ``level`` on stderr for the rest of this process
    (``genesis-fp16 -v``) unless the settings show more; ``None`` goes back to
    ``console_log_level`` alone. Re-configures logging when it was configured
    already."""
    with _LOCK:
        changed = _CONSOLE_OVERRIDE["level"] != level
        _CONSOLE_OVERRIDE["level"] = level
        configured = bool(_CONFIGURED)
    if changed and configured:
        configure_logging(force=True)


# above every level: a console filter at this level lets nothing through
_SILENT = logging.CRITICAL + 10


def add_sink(sink: Callable[[Any, str, dict[str, Any]], dict[str, Any]]) -> None:
    """Pass every event (at or above the lower of the two log levels) through
    ``sink``, a structlog processor, until `remove_sink`. Loggers bound
    before the call see it too: the chain holds one dispatcher that reads the
    list of sinks per event."""
    with _LOCK:
        _SINKS.append(sink)


def remove_sink(sink: Callable[[Any, str, dict[str, Any]], dict[str, Any]]) -> None:
    with _LOCK:
        if sink in _SINKS:
            _SINKS.remove(sink)


def _added_sinks(logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    for sink in list(_SINKS):
        event_dict = sink(logger, method, event_dict)
    return event_dict


def configure_logging(settings: Optional[Settings] = None, *, force: bool = False, quiet_console: bool = False) -> None:
    """Configure structlog once per process (``force`` re-configures, e.g. after
    the state dir changed). ``quiet_console``: events go to the event log only,
    unless the command line asked for them (``-v``); for faults injected on
    purpose (the drill), which would read as real trouble on a terminal."""
    from genesis_fp16.base.settings import load_settings

    with _LOCK:
        if _CONFIGURED and not force:
            return
        settings = settings or load_settings()
        file_level = getattr(logging, settings.log_level.value)
        asked = _CONSOLE_OVERRIDE["level"]
        shown: Optional[LogLevel] = asked if quiet_console else console_level(settings)
        screen_level = _SILENT if shown is None else getattr(logging, shown.value)
        console: list[Any]
        if settings.log_format == LogFormat.JSON:
            console = [structlog.processors.JSONRenderer(default=_jsonable)]
        else:
            console = [_visible_values, structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                JsonlSink(
                    settings.events_path,
                    level=file_level,
                    max_bytes=settings.events_max_bytes,
                    keep=settings.events_keep,
                ),
                _added_sinks,
                ConsoleLevelFilter(screen_level),
                *console,
            ],
            # nothing under both levels is even formatted
            wrapper_class=structlog.make_filtering_bound_logger(min(file_level, screen_level)),
            logger_factory=structlog.PrintLoggerFactory(file=_STDERR),  # type: ignore[arg-type]
            cache_logger_on_first_use=False,
        )
        _CONFIGURED.clear()
        _CONFIGURED.update(
            events_path=settings.events_path,
            level=settings.log_level.value,
            console_level=shown.value if shown else None,
        )


def get_logger(name: str = "genesis_fp16", **bound: Any) -> Any:
    configure_logging()
    return structlog.get_logger(name).bind(component=name, **bound)


def events_path() -> Optional[Path]:
    return _CONFIGURED.get("events_path")


def log_once(logger: Any, key: str, level: str, event: str, **fields: Any) -> bool:
    """Log an event only the first time ``key`` is seen in this process."""
    with _LOCK:
        if key in _ONCE_KEYS:
            return False
        _ONCE_KEYS.add(key)
    getattr(logger, level)(event, **fields)
    return True


def reset_once() -> None:
    """Forget which one-time messages were logged (tests)."""
    with _LOCK:
        _ONCE_KEYS.clear()


EVENT_MAX_LINE = 1024 * 1024
"""A longer line is not an event this code writes (one is at most a few KiB)."""
EVENT_MAX_DEPTH = 32
"""Deeper nesting is not an event this code writes (one nests at most 4 deep)."""
_EVENTS_FIX = "name the JSON-lines log that training writes (--events FILE), or move this one aside"
_REPAIR = "delete or repair that line"


def read_events(path: Path, *, include_rotated: bool = False) -> list[dict[str, Any]]:
    """Read a JSON-lines event log, skipping a torn last line (a process killed
    mid-write) but failing loudly on garbage in the middle. ``include_rotated``
    reads the rotated files first (``path.N`` ... ``path.1``, then ``path``),
    so the events come oldest first; a rotation running meanwhile in another
    process can make this read miss or repeat a file's worth of events.

    The log is read as untrusted input (`genesis_fp16.base.untrusted.open_untrusted`):
    a FIFO, a device or a directory in its place, a line longer than
    `EVENT_MAX_LINE`, nested deeper than `EVENT_MAX_DEPTH` or that is not a
    JSON object is a ValueError naming the file (and the line) and the fix."""
    path = Path(path)
    files = rotated_files(path)[::-1] if include_rotated else []
    if os.path.lexists(path):  # anything there is read, and named when it is not a regular file
        files.append(path)
    if not files:
        raise FileNotFoundError(
            f"event log {path} does not exist" + (" and has no rotated files" if include_rotated else "")
        )
    events: list[dict[str, Any]] = []
    for file in files:
        events.extend(_read_event_file(file))
    return events


def _event(path: Path, number: int, raw: bytes) -> tuple[Optional[dict[str, Any]], str, bool]:
    """(the event on line ``number``, or None with what is wrong, and whether a torn write explains it)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        byte = f"byte {raw[exc.start]:#04x} at column {exc.start + 1}"
        return (
            None,
            (
                f"{path}:{number}: not UTF-8 text ({byte}); the event log is written as UTF-8 JSON lines: "
                "delete or repair that line"
            ),
            True,
        )  # a write cut in a character
    try:
        event = untrusted.parse_json(line, EVENT_MAX_DEPTH, non_finite=True)  # the sink writes NaN as NaN
    except untrusted.JsonProblem as exc:
        return None, f"{path}:{number}: not a JSON event line: it {exc}; {_REPAIR}", exc.torn
    if not isinstance(event, dict):
        what = "null" if event is None else f"a JSON {type(event).__name__}"
        return None, f"{path}:{number}: not a JSON event line: it holds {what}, expected an object; {_REPAIR}", False
    return event, "", False


def _read_event_file(path: Path) -> list[dict[str, Any]]:
    """One log file's events. Each line is decoded alone, so a line that is not
    UTF-8 is told by its number like a line that is not JSON; either one is
    skipped as torn when it is the last line, and an error naming the file and
    the line anywhere else."""
    try:
        fd = untrusted.open_untrusted(path, "event log", _EVENTS_FIX)
    except untrusted.UntrustedFileError as exc:
        raise ValueError(str(exc)) from None
    events: list[dict[str, Any]] = []
    torn = ""  # what is wrong with the line before, told only when another line follows it
    with os.fdopen(fd, "rb") as file:
        for number, raw in enumerate(iter(lambda: file.readline(EVENT_MAX_LINE + 1), b""), start=1):
            if torn:
                raise ValueError(torn)
            if len(raw) > EVENT_MAX_LINE:
                raise ValueError(
                    f"{path}:{number}: the line is longer than {EVENT_MAX_LINE // 1024} KiB, "
                    f"not an event this code writes; {_REPAIR}"
                )
            if not raw.strip():
                continue
            event, problem, maybe_torn = _event(path, number, raw.rstrip(b"\r\n"))
            if event is not None:
                events.append(event)
            elif maybe_torn:
                torn = problem
            else:
                raise ValueError(problem)
    return events
