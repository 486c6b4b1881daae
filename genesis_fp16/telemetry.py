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

from .settings import LogFormat, LogLevel, Settings

_LOCK = threading.Lock()
_CONFIGURED: dict[str, Any] = {}
_ONCE_KEYS: set[str] = set()
# the console level asked for on the command line (`genesis-fp16 -v`); None: the settings decide
_CONSOLE_OVERRIDE: dict[str, Optional[LogLevel]] = {"level": None}

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


class JsonlSink:
    """A processor that appends every event at or above ``level`` as one JSON
    line to a file, then passes the event on unchanged. Each line is written
    with one ``write`` call under a lock, so concurrent threads never
    interleave lines."""

    def __init__(self, path: Path, level: int = logging.INFO) -> None:
        self.path = Path(path)
        self.level = level
        self._lock = threading.Lock()

    def __call__(self, logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        if _level_number(method, event_dict) < self.level:
            return event_dict
        record = {k: _jsonable(v) for k, v in event_dict.items()}
        record.setdefault("pid", os.getpid())
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(line)
            except OSError as exc:  # the console still shows the event
                sys.stderr.write(f"genesis-fp16: cannot write event log {self.path}: {exc}\n")
        return event_dict


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


def configure_logging(settings: Optional[Settings] = None, *, force: bool = False) -> None:
    """Configure structlog once per process (``force`` re-configures, e.g. after
    the state dir changed)."""
    from .settings import load_settings

    with _LOCK:
        if _CONFIGURED and not force:
            return
        settings = settings or load_settings()
        file_level = getattr(logging, settings.log_level.value)
        shown = console_level(settings)
        screen_level = getattr(logging, shown.value)
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
                JsonlSink(settings.events_path, level=file_level),
                ConsoleLevelFilter(screen_level),
                *console,
            ],
            # nothing under both levels is even formatted
            wrapper_class=structlog.make_filtering_bound_logger(min(file_level, screen_level)),
            logger_factory=structlog.PrintLoggerFactory(file=_STDERR),  # type: ignore[arg-type]
            cache_logger_on_first_use=False,
        )
        _CONFIGURED.clear()
        _CONFIGURED.update(events_path=settings.events_path, level=settings.log_level.value, console_level=shown.value)


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


def read_events(path: Path) -> list[dict[str, Any]]:
    """Read a JSON-lines event log, skipping a torn last line (a process killed
    mid-write) but failing loudly on garbage in the middle."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"event log {path} does not exist")
    lines = path.read_text(encoding="utf-8").splitlines()
    events = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a JSON event line ({exc.msg})") from None
    return events
