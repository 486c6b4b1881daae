"""Every fenced block in README.md and docs/*.md is checked here, one test id
per block (``README.md:L47``):

- ``python`` blocks run, in order, one namespace per page, in a scratch cwd and
  state dir;
- ``bash``/``sh``/``console`` blocks are parsed, not run: each ``genesis-fp16``
  command is resolved against the real CLI (every subcommand and ``--flag`` must
  exist), each ``python``/``torchrun`` script's ``--flag`` must appear in its
  ``--help``, and every repo path they name (scripts/, configs/, ...) must exist.

A block that cannot run here carries ``<!-- snippet: skip (REASON) -->`` on the
line before its fence and is reported as a skip with that reason. A fence with
no language fails: use ``text`` for diagrams and pseudocode.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

if sys.version_info >= (3, 11):
    import tomllib
else:  # the tomli backport, a dependency below 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
SKIP = re.compile(r"<!--\s*snippet:\s*skip\s*\((?P<reason>.+)\)\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+)(?P<lang>[\w+-]*)\s*$")
REPO_PATH = re.compile(r"^(scripts|configs|examples|tests|docs)/[\w./-]+$")
EXTRA = re.compile(r"^\.\[(?P<names>[\w,-]+)\]$")  # pip install -e ".[dev]"
FLAG = re.compile(r"^\[?(?P<flag>--?[A-Za-z][\w-]*)")
CLI_PROGRAMS = {"genesis-fp16", ".venv/bin/genesis-fp16"}
PYTHON_PROGRAMS = {"python", "python3", ".venv/bin/python", "torchrun"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:L{self.line}"


def parse_blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, indent, fence = i, len(m["indent"]), m["fence"]
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(
                lines[i][indent:]
                if not lines[i][:indent].strip()
                else lines[i].lstrip()
            )
            i += 1
        prev = lines[start - 1] if start else ""
        skip = SKIP.search(prev)
        blocks.append(
            Block(
                page,
                start + 1,
                m["lang"].lower(),
                "\n".join(body) + "\n",
                skip["reason"] if skip else None,
            )
        )
        i += 1
    return blocks


BLOCKS = [b for page in PAGES for b in parse_blocks(page)]


def test_blocks_found_and_every_fence_names_its_language():
    assert len([b for b in BLOCKS if b.lang in PYTHON]) >= 8
    assert len([b for b in BLOCKS if b.lang in SHELL]) >= 25
    bare = [b.id for b in BLOCKS if not b.lang]
    assert not bare, (
        f"fences without a language (use text for diagrams, bash for commands): {bare}"
    )
    markers = sum(len(SKIP.findall(page.read_text(encoding="utf-8"))) for page in PAGES)
    assert markers == len([b for b in BLOCKS if b.skip]), (
        "a snippet: skip marker must sit on the line right before a fence"
    )


# -- Python blocks ------------------------------------------------------------

# pages with a block to run; a skipped block is reported by test_python_block_marked_skip
PY_PAGES = sorted({b.page for b in BLOCKS if b.lang in PYTHON and not b.skip})


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("page", PY_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_blocks_run(page, state_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"doc_{page.stem.lower()}"}
    for block in (
        b for b in BLOCKS if b.page == page and b.lang in PYTHON and not b.skip
    ):
        exec(compile(block.code, block.id, "exec"), namespace)  # noqa: S102 -- our own docs, run as written


def _check_skip_reason(block: Block) -> None:
    """A block skipped as "run by tests/x.py" must really be run there."""
    m = re.search(r"tests/[\w/]+\.py", block.skip)
    if m:
        other = ROOT / m[0]
        assert other.is_file() and block.page.name in other.read_text(
            encoding="utf-8"
        ), (
            f"{block.id}: skip says {m[0]} runs it, but that file does not name {block.page.name}"
        )


SKIPPED = [b for b in BLOCKS if b.lang in PYTHON and b.skip]


@pytest.mark.parametrize("block", SKIPPED, ids=lambda b: b.id)
def test_python_block_marked_skip(block):
    _check_skip_reason(block)
    pytest.skip(f"{block.id}: {block.skip}")


# -- shell blocks -------------------------------------------------------------


def commands(code: str) -> list[list[str]]:
    """The simple commands of a block: continuations joined, comments, prompts,
    env assignments and control words dropped, split at ; && || |."""
    text = re.sub(r"\\\n", " ", code)
    out = []
    for line in text.splitlines():
        line = line.strip()
        line = line.removeprefix("$ ")
        line = re.sub(
            r"(?<=\w)\|(?=\w)", "\x1f", line
        )  # a|b in a synopsis: alternatives, not a pipe
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = [t.replace("\x1f", "|") for t in lexer]
        except ValueError:  # an unterminated quote: a multi-line python -c
            continue
        cmd: list[str] = []
        for tok in tokens + [";"]:
            if tok and set(tok) <= set(";&|"):
                while cmd and (
                    re.match(r"^[A-Z_][A-Z0-9_]*=", cmd[0])
                    or cmd[0] in {"do", "done", "then", "export"}
                ):
                    cmd.pop(0)
                if cmd:
                    out.append(cmd)
                cmd = []
            else:
                cmd.append(tok)
    return out


@cache
def cli_root() -> TyperGroup:
    from genesis_fp16 import cli

    return typer.main.get_command(cli.app)


def _options(cmd) -> set[str]:
    """The option names of a Typer command (arguments' names have no dash)."""
    names = {"--help"}
    for p in cmd.params:
        names.update(o for o in [*p.opts, *p.secondary_opts] if o.startswith("-"))
    return names


def check_cli(tokens: list[str]) -> list[str]:
    """Problems with one ``genesis-fp16 ...`` line (also a usage synopsis:
    ``[--flag X]``, ``a|b`` alternatives, UPPERCASE placeholders)."""
    problems, current, path = [], [cli_root()], ["genesis-fp16"]
    args = tokens[1:]
    i = 0
    # walk the group tree: options met on the way belong to the group
    while i < len(args) and all(isinstance(c, TyperGroup) for c in current):
        tok = args[i].strip("[]")
        m = FLAG.match(args[i])
        if m:
            if not any(m["flag"] in _options(c) for c in current):
                problems.append(f"{' '.join(path)}: no option {m['flag']}")
            i += 1
            continue
        if tok.isupper() or tok == "...":
            return problems  # COMMAND placeholder: nothing more to resolve
        nxt = []
        for name in tok.split("|"):
            sub = current[0].commands.get(name) if len(current) == 1 else None
            if sub is None:
                problems.append(f"{' '.join(path)}: no command {name!r}")
            else:
                nxt.append(sub)
        if not nxt:
            return problems
        path.append(tok)
        current = nxt
        i += 1
    allowed = set().union(*(_options(c) for c in current))
    for tok in args[i:]:
        m = FLAG.match(tok)
        if m and m["flag"] not in allowed:
            problems.append(f"{' '.join(path)}: no option {m['flag']}")
    return problems


@cache
def extras() -> set[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return set(tomllib.load(f)["project"]["optional-dependencies"])


@cache
def script_help(script: str) -> str:
    proc = subprocess.run(
        [sys.executable, script, "--help"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, f"{script} --help failed: {proc.stderr[-500:]}"
    return proc.stdout


def check_other(tokens: list[str]) -> list[str]:
    problems = [
        f"{tok}: no such file in the repo"
        for tok in tokens
        if REPO_PATH.match(tok)
        and not (ROOT / tok).exists()
        and not tok.endswith((".json", ".csv", ".png"))
    ]
    for tok in tokens:
        m = EXTRA.match(tok)
        if m:
            problems += [
                f"{tok}: no extra {name!r} in pyproject.toml"
                for name in m["names"].split(",")
                if name not in extras()
            ]
    if tokens[0] in PYTHON_PROGRAMS:
        script = next(
            (t for t in tokens[1:] if t.endswith(".py") and (ROOT / t).is_file()), None
        )
        if script:
            help_text = script_help(script)
            for tok in tokens[tokens.index(script) + 1 :]:
                m = FLAG.match(tok)
                if m and not re.search(rf"{re.escape(m['flag'])}\b", help_text):
                    problems.append(f"{script}: no option {m['flag']} in its --help")
    return problems


def check_shell(code: str) -> tuple[list[str], int]:
    problems, checked = [], 0
    for tokens in commands(code):
        if tokens[0] in CLI_PROGRAMS:
            problems += check_cli(tokens)
            checked += 1
        elif tokens[0] in PYTHON_PROGRAMS or any(
            REPO_PATH.match(t) or EXTRA.match(t) for t in tokens
        ):
            problems += check_other(tokens)
            checked += 1
    return problems, checked


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.lang in SHELL], ids=lambda b: b.id
)
def test_shell_block_names_real_commands_and_flags(block):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    problems, _ = check_shell(block.code)
    assert not problems, f"{block.id}: " + "; ".join(problems)


def test_checker_catches_a_renamed_flag_or_command():
    assert check_shell("genesis-fp16 evolve --seed 3 --json out.json\n") == ([], 1)
    assert check_shell("genesis-fp16 evolve --seeds 3\n")[0] == [
        "genesis-fp16 evolve: no option --seeds"
    ]
    assert check_shell("genesis-fp16 rollout status|enabel\n")[0] == [
        "genesis-fp16 rollout: no command 'enabel'"
    ]
    assert check_shell(
        "OMP_NUM_THREADS=1 .venv/bin/python scripts/check_cartpole.py --jsn x\n"
    )[0] == ["scripts/check_cartpole.py: no option --jsn in its --help"]
    assert check_shell("python scripts/nope.py\n")[0] == [
        "scripts/nope.py: no such file in the repo"
    ]
