"""Names meant as settings that are none, and files the settings sources cannot read.

pydantic-settings skips what it does not know: an unknown variable, an empty
value, a ``.env`` line it cannot parse. For most names that is right (the
environment holds many other programs' variables); for a name meant as a
setting it silently keeps the default. The worst case is the kill switch: a
variable such as ``DISABLE_FP16_TRAINING=true``, ``USE_AMP=false`` or
``HALF_PRECISION=false`` would leave reduced precision on, so every name that
looks like a switch for reduced-precision training (`looks_like_switch`: a
rule on its words, not a list of names) and is not ``ENABLE_FP16_TRAINING``
is refused, as is an empty ``ENABLE_FP16_TRAINING``.

The functions take the names they check against as arguments, so this module
sits below `genesis_fp16.base.settings`, which gathers the sources and re-exports
what other modules import from it.
"""

from __future__ import annotations

import difflib
import functools
import io
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple, Optional

from dotenv.parser import parse_stream

from genesis_fp16.base import untrusted

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

KILL_SWITCH = "ENABLE_FP16_TRAINING"
# A name outside the prefix this close to a setting's variable (difflib's
# ratio) is a misspelling of it: two edits in the 17+ characters of the
# variables (ENABEL_FP16_TRAINING 0.95, GENESIS_FP16PRECISION 0.98), while
# ENABLE_TRAINING (0.86) or CUDA_VISIBLE_DEVICES (0.46) are other names.
NEAR_CUTOFF = 0.9
# Other programs' variables that read as a switch for this one's precision, by prefix: TensorFlow's
# (TF_ENABLE_AUTO_MIXED_PRECISION and its _GRAPH_REWRITE / _LOSS_SCALING, NVIDIA containers), PyTorch/XLA's
# (XLA_USE_BF16), ONNX Runtime's (ORT_TENSORRT_FP16_ENABLE), Hugging Face Accelerate's (ACCELERATE_MIXED_PRECISION).
OTHER_PROGRAMS = ("TF_", "XLA_", "ORT_", "ACCELERATE_")
# The rule reads a name as words between "_" (and any other character that is not a letter or a digit).
# A reduced precision: FP16, BF16 or PRECISION anywhere (ENABLEFP16 too), or the word AMP or HALF (not BEHALF, CHAMP).
_PRECISION_TEXT = re.compile(r"FP16|BF16|PRECISION")
_PRECISION_WORDS = frozenset({"AMP", "HALF"})
# A switch: ENABLE or DISABLE anywhere, or the word USE, NO, TRAIN or MODE (not NO_PROXY's alone, not TRAINING_LOG).
_SWITCH_TEXT = re.compile(r"ENABLE|DISABLE")
_SWITCH_WORDS = frozenset({"USE", "NO", "TRAIN", "MODE"})
# A name made only of these words (two or more, a precision among them) is the kill switch without its verb:
# FP16_TRAINING, HALF_PRECISION, MIXED_PRECISION_TRAINING, BF16_ON.
_SWITCH_NOUNS = frozenset(
    {"FP16", "BF16", "AMP", "HALF", "MIXED", "PRECISION", "TRAINING", "TRAIN", "MODE", "ON", "OFF"}
)
_DOCTOR = "`genesis-fp16 doctor` lists the valid names"


class SettingsError(ValueError):
    """An invalid setting: names the variable, the value given and what is allowed."""


class Problem(NamedTuple):
    """One name or value the settings would skip. ``kill_switch``: it would
    leave reduced precision on silently, so it is refused even where unknown
    names are let pass."""

    message: str
    kill_switch: bool = False


def looks_like_switch(name: str, prefix: str = "") -> bool:
    """Whether ``name`` (any case) reads as switching reduced-precision training on or off, by one rule, not a list:
    cut into words at ``_``, it names a precision (FP16, BF16 or PRECISION anywhere; AMP or HALF as a word) and a
    switch (ENABLE or DISABLE anywhere; USE, NO, TRAIN or MODE as a word): ``USE_AMP``, ``TRAIN_FP16``,
    ``FP16_MODE``, ``GENESIS_FP16_DISABLE``; or it is made of such words alone, two or more (``FP16_TRAINING``,
    ``HALF_PRECISION``). Beside ENABLE and DISABLE the name is read without ``prefix`` (its FP16 does not make
    ``GENESIS_FP16_NO_COLOR`` a switch). ``BF16_ONLY``, ``FP16``, ``BEHALF_MODE`` or ``FP16_TRAINING_LOG`` are not
    switches; another program's names (`OTHER_PROGRAMS`) are not either."""
    upper = name.upper()
    if upper.startswith(OTHER_PROGRAMS):
        return False
    if _SWITCH_TEXT.search(upper) and _PRECISION_TEXT.search(upper):  # the whole name: GENESIS_FP16_DISABLE too
        return True
    rest = upper[len(prefix) :] if prefix and upper.startswith(prefix) else upper
    words = [w for w in re.split(r"[^A-Z0-9]+", rest) if w]
    if not (_PRECISION_TEXT.search(rest) or _PRECISION_WORDS.intersection(words)):
        return False
    if _SWITCH_TEXT.search(rest) or _SWITCH_WORDS.intersection(words):
        return True
    return len(words) >= 2 and set(words) <= _SWITCH_NOUNS


@functools.lru_cache(maxsize=4096)  # the same environment is checked at every load
def closest(name: str, valid: tuple[str, ...], cutoff: float = 0.6) -> Optional[str]:
    """The name in ``valid`` most like ``name`` (upper case), if one is at least ``cutoff`` alike."""
    close = difflib.get_close_matches(name.upper(), valid, n=1, cutoff=cutoff)
    return close[0] if close else None


def name_problem(name: str, where: str, valid: tuple[str, ...], prefix: str) -> Optional[Problem]:
    """What is wrong with the variable ``name`` (environment or ``.env``), or
    None for a setting's variable or another program's name. Meant as a
    setting: a switch-like name (`looks_like_switch`), any name under
    ``prefix``, and a near miss of a variable (a mangled prefix, a typo in the
    kill switch)."""
    upper = name.upper()
    if upper in valid:
        return None
    if looks_like_switch(upper, prefix):
        return Problem(
            f"unknown setting {name} {where}; did you mean {KILL_SWITCH}? It is the one switch for reduced "
            f"precision ({KILL_SWITCH}=false: every agent trains in FP32) and {name} is not read, so FP16/BF16 "
            f"would stay on; rename it or unset it ({_DOCTOR})",
            kill_switch=True,
        )
    near = closest(upper, valid, NEAR_CUTOFF)
    if not upper.startswith(prefix) and near is None:
        return None
    near = near or closest(upper, valid)
    hint = f"did you mean {near}?" if near else "no setting has a similar name;"
    return Problem(f"unknown setting {name} {where}; {hint} {_DOCTOR}")


def empty_switch_problem(name: str, value: Optional[str], where: str) -> Optional[Problem]:
    """An empty kill switch: pydantic-settings would take it for unset and keep FP16/BF16 on."""
    if name.upper() != KILL_SWITCH or (value is not None and value.strip()):
        return None
    return Problem(
        f"{name} is empty {where}; set it to false (every agent trains in FP32) or true, "
        "or remove it for the default (true)",
        kill_switch=True,
    )


TEXT_MAX_BYTES = 4 * 1024 * 1024
"""A larger settings, ``.env`` or profile file is not read (one is a few KiB)."""
TOML_MAX_DEPTH = 16
"""Deeper nesting is not a settings or profile file (one nests at most 3 deep)."""


def read_utf8(path: Path, what: str, error: type[ValueError] = SettingsError) -> str:
    """``path`` as UTF-8 text, read as untrusted input (`genesis_fp16.base.untrusted.read_untrusted`: a regular file,
    opened
    without blocking, at most `TEXT_MAX_BYTES`); anything else raises ``error`` naming the file, and a byte that is not
    UTF-8 the line too."""
    try:
        data, _ = untrusted.read_untrusted(
            path, what, "replace it with a regular text file, or remove it", TEXT_MAX_BYTES
        )
    except untrusted.UntrustedFileError as exc:
        raise error(str(exc)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(
            f"{path}:{line}: {what} is not UTF-8 text (byte {data[exc.start]:#04x}); save it as UTF-8"
        ) from None


def read_toml(path: Path, what: str, error: type[ValueError] = SettingsError) -> dict[str, Any]:
    """The TOML file ``path`` (`read_utf8`), nested at most `TOML_MAX_DEPTH` deep; anything else raises ``error``
    naming the file (tomllib recurses: a deeper file is refused, never a RecursionError)."""
    text = read_utf8(path, what, error)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        data = None
    if data is None or untrusted.too_deep(data, TOML_MAX_DEPTH):
        raise error(
            f"{path}: {what} is nested more than {TOML_MAX_DEPTH} levels deep, not a file of settings; "
            "remove the nesting or the file"
        )
    return data


def dotenv_entries(path: Path) -> list[tuple[str, Optional[str], int]]:
    """(name, value, line) of every assignment in a ``.env`` file; a line
    python-dotenv cannot parse (which it would skip with a warning) is a
    SettingsError."""
    entries = []
    for binding in parse_stream(io.StringIO(read_utf8(path, "the .env file"))):
        raw = binding.original.string
        line = binding.original.line + raw[: len(raw) - len(raw.lstrip())].count(
            "\n"
        )  # a binding starts at the blank lines before it
        if binding.error:
            raise SettingsError(
                f"{path}:{line}: cannot parse {raw.strip()!r}; expected NAME=value (quote a value with spaces or '#')"
            )
        if binding.key is not None:
            entries.append((binding.key, binding.value, line))
    return entries


def toml_key_problems(path: Path, fields: list[str]) -> list[Problem]:
    """One problem per top-level key of the TOML file ``path`` that is none of ``fields``."""
    keys = list(read_toml(path, "the settings file"))
    problems = []
    for key in keys:
        if key.lower() not in fields:
            close = difflib.get_close_matches(key.lower(), fields, n=1, cutoff=0.6)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else f"the keys are the settings' names in lower case ({', '.join(fields)})"
            )
            problems.append(Problem(f"{path}: unknown setting {key!r}; {hint}"))
    return problems
