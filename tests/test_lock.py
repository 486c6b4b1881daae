"""requirements/dev.txt (the dev set's constraints, written by
scripts/lock_dev.sh) agrees with pyproject.toml, the README's test command
and .ci/run install from it, and this environment is what it pins."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "dev.txt"
PROJECT = "genesis-fp16"


def _dev_requirements() -> list[Requirement]:
    """The core dependencies and the dev extra, self-referencing extras expanded,
    for this interpreter (markers evaluated)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    out: list[Requirement] = [Requirement(r) for r in project["dependencies"]]
    todo, seen = ["dev"], set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in extras[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == PROJECT:
                todo.extend(req.extras)
            else:
                out.append(req)
    env = default_environment()
    return [r for r in out if r.marker is None or r.marker.evaluate(env)]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line)
        if match:
            pins[canonicalize_name(match.group(1))] = Version(match.group(2))
    return pins


def _direct_in_lock() -> set[str]:
    """Packages the lock says pyproject.toml asked for directly."""
    direct, current = set(), None
    for line in LOCK.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==", line)
        if match:
            current = canonicalize_name(match.group(1))
        elif current and f"{PROJECT} (pyproject.toml)" in line:
            direct.add(current)
    return direct


def test_every_dev_requirement_is_pinned_within_its_range():
    pins = _pins()
    problems = []
    for req in _dev_requirements():
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"{req} is not in the lock")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{req}: the lock pins {pins[name]}")
    assert problems == [], f"requirements/dev.txt disagrees with pyproject.toml ({problems}); run scripts/lock_dev.sh"


def test_the_lock_asks_for_nothing_pyproject_dropped():
    wanted = {canonicalize_name(r.name) for r in _dev_requirements()}
    stale = sorted(_direct_in_lock() - wanted)
    assert stale == [], (
        f"the lock lists {stale} as asked for by pyproject.toml, which no longer does; run scripts/lock_dev.sh"
    )


def test_the_project_itself_and_local_builds_are_not_pinned():
    text = LOCK.read_text()
    assert not re.search(rf"^{PROJECT} ", text, re.M), "the project is installed from the checkout, not the lock"
    assert not re.search(r"^\S+==\S+\+\S+", text, re.M), "a local version label (+cpu) resolves only on one index"


def test_readme_and_ci_install_from_the_lock():
    command = (
        'python3 -m venv .venv && .venv/bin/pip install -c requirements/dev.txt -e ".[dev]" && .venv/bin/python -m '
        "pytest"
    )
    assert command in (REPO / "README.md").read_text()
    assert command in (REPO / ".ci" / "run").read_text()


def test_the_main_job_installs_only_what_it_needs():
    """The README's main job installs the core and the agents extra (gymnasium, cma, pyyaml), pinned by the same
    lock: not the dev set's Ray, mkdocs, MuJoCo and pytest."""
    command = (
        'python3 -m venv .venv && .venv/bin/pip install -c requirements/dev.txt -e ".[agents]" && '
        ".venv/bin/genesis-fp16 evolve"
    )
    assert command in (REPO / "README.md").read_text()


def test_this_environment_is_what_the_lock_pins():
    drift = []
    for name, pinned in _pins().items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            drift.append(f"{name} not installed")
            continue
        if Version(installed.base_version) != Version(pinned.base_version) or installed.pre != pinned.pre:
            drift.append(f"{name} {installed} (lock {pinned})")
    assert drift == [], (
        f"installed packages differ from requirements/dev.txt: {drift}; reinstall with the README's test command"
    )
