"""Every fenced block in README.md and docs/*.md is checked here, one test id
per block (``README.md:L47``):

- ``python`` blocks run, in order, in a scratch cwd and state dir, one fresh
  namespace per section (the blocks under one heading): a section pasted alone
  runs, so each one imports what it uses; and the names each section's code
  uses (in function bodies too) must be defined in it (ruff's F821);
- ``bash``/``sh``/``console`` blocks are checked, then run:

  - checked (every block, skipped or not): each ``genesis-fp16`` command is
    resolved against the real CLI (every subcommand and ``--flag`` must exist),
    each ``python``/``torchrun`` script's ``--flag`` must appear in its
    ``--help``, and every repo path they name (scripts/, configs/, ...) must
    exist; this names a renamed flag plainly;
  - run (every block not skipped): with bash under ``set -eo pipefail``, one
    block per test, in a fresh scratch cwd whose ``.genesis_fp16`` is the state
    dir, with a per-block timeout (see :func:`run_shell`).

A ``python`` block that is a whole script (its workers import its main module, as spawned processes do) carries
``<!-- snippet: script NAME.py ARGS -->`` on the line before its fence: it is written to ``NAME.py`` in a scratch
checkout and run as ``python NAME.py ARGS``, as a user who saved it would (see :func:`test_python_scripts_run`).

A block that cannot run here carries ``<!-- snippet: skip (REASON) -->`` on the
line before its fence and is reported as a skip with that reason. A reason that
names ``tests/x.py::test_name`` is checked: that test must exist. A fence with
no language fails: use ``text`` for diagrams and pseudocode.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
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
SCRIPT = re.compile(r"<!--\s*snippet:\s*script\s+(?P<name>\w+\.py)(?P<args>[^>]*?)\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+)(?P<lang>[\w+-]*)\s*$")
HEADING = re.compile(r"^#{1,6}\s+\S")  # outside a fence: a section starts
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
    section: str = ""  # the heading it is under, with its line ("L12 ## 1. Describe the task"); "" before the first
    script: str | None = None  # "NAME.py ARGS": a whole script, run as ``python NAME.py ARGS``

    @property
    def id(self) -> str:
        page = self.page.relative_to(ROOT).as_posix() if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}:L{self.line}"


def parse_blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i, section = [], 0, ""
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if HEADING.match(lines[i]):
                section = f"L{i + 1} {lines[i].strip()}"
            i += 1
            continue
        start, indent, fence = i, len(m["indent"]), m["fence"]
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if not lines[i][:indent].strip() else lines[i].lstrip())
            i += 1
        prev = lines[start - 1] if start else ""
        skip, script = SKIP.search(prev), SCRIPT.search(prev)
        blocks.append(
            Block(
                page,
                start + 1,
                m["lang"].lower(),
                "\n".join(body) + "\n",
                skip["reason"] if skip else None,
                section,
                f"{script['name']}{script['args']}" if script else None,
            )
        )
        i += 1
    return blocks


BLOCKS = [b for page in PAGES for b in parse_blocks(page)]


def test_blocks_found_and_every_fence_names_its_language():
    assert len([b for b in BLOCKS if b.lang in PYTHON]) >= 8
    assert len([b for b in BLOCKS if b.lang in SHELL]) >= 25
    bare = [b.id for b in BLOCKS if not b.lang]
    assert not bare, f"fences without a language (use text for diagrams, bash for commands): {bare}"
    markers = sum(len(SKIP.findall(page.read_text(encoding="utf-8"))) for page in PAGES)
    assert markers == len([b for b in BLOCKS if b.skip]), (
        "a snippet: skip marker must sit on the line right before a fence"
    )
    scripts = sum(len(SCRIPT.findall(page.read_text(encoding="utf-8"))) for page in PAGES)
    assert scripts == len([b for b in BLOCKS if b.script and b.lang in PYTHON]), (
        "a snippet: script marker must sit on the line right before a python fence"
    )


# -- Python blocks ------------------------------------------------------------

# pages with a block to run; a skipped block is reported by test_python_block_marked_skip
PY_PAGES = sorted({b.page for b in BLOCKS if b.lang in PYTHON and not b.skip and not b.script})


def sections(blocks: list[Block]) -> dict[str, list[Block]]:
    """The Python blocks of ``blocks`` by the section they are in, in page order."""
    out: dict[str, list[Block]] = {}
    for block in blocks:
        if block.lang in PYTHON:
            out.setdefault(block.section, []).append(block)
    return out


def run_sections(page: Path, blocks: list[Block]) -> dict[str, dict]:
    """Run each section's blocks, in order, each section in a fresh namespace
    (as if pasted alone into a new interpreter); the namespaces by section. A
    name another section defined is a failure naming the block and section."""
    namespaces: dict[str, dict] = {}
    for section, in_section in sections(blocks).items():
        namespace = namespaces[section] = {"__name__": f"doc_{page.stem.lower()}"}
        for block in in_section:
            try:
                exec(compile(block.code, block.id, "exec"), namespace)  # noqa: S102 -- our own docs, run as written
            except NameError as exc:
                raise AssertionError(
                    f"{block.id} (section {section or 'before the first heading'}): {exc}; each section runs alone, "
                    "in a "
                    "fresh namespace: import or define the name in this section"
                ) from exc
    return namespaces


def undefined_names(sections_code: dict[str, str]) -> dict[str, list[str]]:
    """ruff's undefined-name check (F821) on each section's code (its blocks
    joined): name -> the names it uses without defining or importing them,
    in function bodies too (which running it would not reach). Skips the test
    when ruff (a dev dependency) is not installed."""
    import json
    import tempfile

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for i, (name, code) in enumerate(sections_code.items()):
            path = Path(tmp) / f"section_{i}.py"
            path.write_text(code, encoding="utf-8")
            files[str(path)] = name
        proc = subprocess.run(
            [ruff, "check", "--isolated", "--no-cache", "--select", "F821", "--output-format", "json", *files],
            capture_output=True,
            text=True,
            timeout=60,
        )
    found: dict[str, list[str]] = {name: [] for name in sections_code}
    for problem in json.loads(proc.stdout or "[]"):
        found[files[problem["filename"]]].append(problem["message"])
    return found


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("page", PY_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_blocks_run(page, state_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_sections(page, [b for b in BLOCKS if b.page == page and not b.skip and not b.script])


SCRIPTS = [b for b in BLOCKS if b.lang in PYTHON and b.script and not b.skip]
SCRIPT_TIMEOUT_S = 180  # a whole script on a tiny budget (the EMBEDDING example: about 10 s of CPU)


@pytest.mark.parametrize("block", SCRIPTS, ids=lambda b: b.id)
def test_python_scripts_run(block, tmp_path):
    """A block that is a whole script runs as one: saved as its ``NAME.py`` in a scratch checkout, then ``python
    NAME.py ARGS`` (its spawned workers import it by path, which no in-process run would show)."""
    name, _, args = block.script.partition(" ")
    env = scratch_dir(tmp_path)
    (tmp_path / name).write_text(block.code, encoding="utf-8")
    failed = run_shell(f"python {name} {args}\n", tmp_path, env, timeout=SCRIPT_TIMEOUT_S)
    assert failed is None, f"{block.id} ({block.script}): {failed}"


def test_python_sections_define_the_names_they_use():
    runnable = [b for b in BLOCKS if b.lang in PYTHON and not b.skip and not b.script]
    code = {
        f"{page.relative_to(ROOT).as_posix()} {section}": "\n".join(b.code for b in blocks)
        for page in PY_PAGES
        for section, blocks in sections([b for b in runnable if b.page == page]).items()
    }
    code.update({f"{b.id} (the script {b.script})": b.code for b in SCRIPTS})  # a script stands alone
    problems = {name: found for name, found in undefined_names(code).items() if found}
    assert not problems, f"names a section uses but does not define (each section runs alone): {problems}"


def test_sections_are_run_alone(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## 1. One\n\n```python\nimport math\nx = math.pi\n```\n\n"
        "```python\ny = x\n```\n\n## 2. Two\n\n```python\nz = math.tau\n```\n",
        encoding="utf-8",
    )
    blocks = parse_blocks(page)
    assert [b.section for b in blocks] == ["L3 ## 1. One", "L3 ## 1. One", "L14 ## 2. Two"]
    with pytest.raises(AssertionError, match=r"page.md:L16 \(section L14 ## 2. Two\): name 'math' is not defined"):
        run_sections(page, blocks)  # the blocks of one section share a namespace, the next section starts afresh
    code = {"one": "def f():\n    return THERMOSTAT\n", "two": "import math\nx = math.pi\n"}
    assert undefined_names(code) == {"one": ["Undefined name `THERMOSTAT`"], "two": []}


def _check_skip_reason(block: Block) -> None:
    """A block skipped as "run by tests/x.py" must really be run there: the
    file names the page, or ``tests/x.py::test_name`` names a test it has."""
    for m in re.finditer(r"(?P<file>tests/[\w/]+\.py)(?:::(?P<test>\w+))?", block.skip):
        other = ROOT / m["file"]
        assert other.is_file(), f"{block.id}: skip names {m['file']}, which does not exist"
        text = other.read_text(encoding="utf-8")
        if m["test"]:
            assert re.search(rf"^(async )?def {m['test']}\(", text, re.M), (
                f"{block.id}: skip names {m[0]}, but {m['file']} has no test {m['test']}"
            )
        else:
            assert block.page.name in text, (
                f"{block.id}: skip says {m['file']} runs it, but that file does not name {block.page.name}"
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
        line = re.sub(r"(?<=\w)\|(?=\w)", "\x1f", line)  # a|b in a synopsis: alternatives, not a pipe
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
                while cmd and (re.match(r"^[A-Z_][A-Z0-9_]*=", cmd[0]) or cmd[0] in {"do", "done", "then", "export"}):
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
        if REPO_PATH.match(tok) and not (ROOT / tok).exists() and not tok.endswith((".json", ".csv", ".png"))
    ]
    for tok in tokens:
        m = EXTRA.match(tok)
        if m:
            problems += [
                f"{tok}: no extra {name!r} in pyproject.toml" for name in m["names"].split(",") if name not in extras()
            ]
    if tokens[0] in PYTHON_PROGRAMS:
        script = next((t for t in tokens[1:] if t.endswith(".py") and (ROOT / t).is_file()), None)
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
        elif tokens[0] in PYTHON_PROGRAMS or any(REPO_PATH.match(t) or EXTRA.match(t) for t in tokens):
            problems += check_other(tokens)
            checked += 1
    return problems, checked


SHELL_BLOCKS = [b for b in BLOCKS if b.lang in SHELL]


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.id)
def test_shell_block_names_real_commands_and_flags(block):
    # skipped blocks too: checking runs nothing, and a renamed flag in a
    # command too slow to run here is still a broken doc
    problems, _ = check_shell(block.code)
    assert not problems, f"{block.id}: " + "; ".join(problems)


def test_checker_catches_a_renamed_flag_or_command():
    assert check_shell("genesis-fp16 evolve --seed 3 --json out.json\n") == ([], 1)
    assert check_shell("genesis-fp16 evolve --seeds 3\n")[0] == ["genesis-fp16 evolve: no option --seeds"]
    assert check_shell("genesis-fp16 rollout status|enabel\n")[0] == ["genesis-fp16 rollout: no command 'enabel'"]
    assert check_shell("OMP_NUM_THREADS=1 .venv/bin/python scripts/check_cartpole.py --jsn x\n")[0] == [
        "scripts/check_cartpole.py: no option --jsn in its --help"
    ]
    assert check_shell("python scripts/nope.py\n")[0] == ["scripts/nope.py: no such file in the repo"]


# -- shell blocks: run ----------------------------------------------------------

RUN_TIMEOUT_S = 60  # per block: a hang fails the test instead of holding up CI
COPIED = (
    "scripts",
    "benchmarks",
    "configs",
    "examples",
    "docs/evolution",
    # what the commands read from the repo (benchmarks: the baselines scripts/evolution_table.py imports;
    # docs/evolution:
    # the reports --summarize reads)
)
FAILED = "__snippet_failed__"
# bash stops at the first failing command (pipes included) and says where
PRELUDE = f"set -eo pipefail\ntrap 'echo \"{FAILED} $? $LINENO\" >&2' ERR\n"


def shell_script(block: Block) -> str:
    """The commands of a block; in a ``console`` block only the ``$ `` lines
    (and their continuations) are commands, the rest is their output."""
    if block.lang != "console":
        return block.code
    lines, more = [], False
    for line in block.code.splitlines():
        if more or line.startswith("$ "):
            lines.append(line if more else line[2:])
            more = line.endswith("\\")
    return "\n".join(lines) + "\n"


def scratch_dir(root: Path) -> dict[str, str]:
    """Make ``root`` a scratch checkout to run doc commands in; return their
    environment.

    ``scripts/``, ``benchmarks/``, ``configs/``, ``examples/`` and ``docs/evolution/`` are copies (small files),
    so a command that writes next to its inputs cannot touch the repo, and a
    relative ``--json out.json`` lands in ``root``. ``.venv/bin`` holds
    wrappers that exec the interpreter running the tests, so ``python``,
    ``genesis-fp16``, ``.venv/bin/genesis-fp16`` and ``torchrun`` work however
    the suite was installed. The state dir is ``root/.genesis_fp16`` (the
    default name, so the docs' ``.genesis_fp16/events.jsonl`` is it) and starts
    with an empty event log, as any earlier command would leave one."""
    for name in COPIED:
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    wrappers = {
        "python": "",
        "python3": "",
        "genesis-fp16": "-c 'import sys; sys.argv[0] = \"genesis-fp16\"; from genesis_fp16.cli import main; main()'",
        "pytest": "-m pytest",
        "torchrun": "-m torch.distributed.run",
    }
    for name, args in wrappers.items():
        exe = bin_dir / name
        exe.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {args} "$@"\n', encoding="utf-8")
        exe.chmod(0o755)
    state = root / ".genesis_fp16"
    state.mkdir()
    (state / "events.jsonl").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENESIS_FP16_")}
    env.pop("ENABLE_FP16_TRAINING", None)
    env.update(
        GENESIS_FP16_STATE_DIR=str(state),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS="1",  # a shared CI machine: tiny runs are fastest on one thread
        COLUMNS="120",
    )
    return env


def run_shell(script: str, cwd: Path, env: dict[str, str], timeout: float = RUN_TIMEOUT_S) -> str | None:
    """Run ``script`` with bash in ``cwd``; None when it succeeds, else what
    failed: the command, its exit code and the tail of the output. The whole
    process group is killed afterwards, so nothing it started outlives it."""
    proc = subprocess.Popen(
        ["bash", "-c", PRELUDE + script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return f"still running after {timeout:.0f} s\n--- output ---\n{_tail(out)}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    if proc.returncode == 0:
        return None
    failed = [line.split() for line in out.splitlines() if line.startswith(FAILED)]
    shown = _tail("\n".join(line for line in out.splitlines() if not line.startswith(FAILED)))
    if not failed:
        return f"bash exited {proc.returncode}\n--- output ---\n{shown}"
    code, at = failed[-1][1], int(failed[-1][2]) - PRELUDE.count("\n") - 1
    lines = script.splitlines()
    start = end = at  # $LINENO is one line of a continued command: widen to all of it
    while start > 0 and lines[start - 1].endswith("\\"):
        start -= 1
    while end < len(lines) - 1 and lines[end].endswith("\\"):
        end += 1
    command = " ".join(line.strip().rstrip("\\").strip() for line in lines[start : end + 1])
    return f"line {start + 1}: `{command}` exited {code}\n--- output ---\n{shown}"


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.id)
def test_shell_block_runs(block, tmp_path):
    if block.skip:
        _check_skip_reason(block)
        pytest.skip(f"{block.id}: {block.skip}")
    failure = run_shell(shell_script(block), tmp_path, scratch_dir(tmp_path))
    assert failure is None, f"{block.id}: {failure}"


def test_runner_reports_the_failing_command_and_stays_out_of_the_repo(tmp_path):
    env = scratch_dir(tmp_path)
    ok = "genesis-fp16 --help > help.txt\n.venv/bin/python -c \"open('out.json', 'w').write('{}')\"\n"
    assert run_shell(ok, tmp_path, env) is None
    assert "evolve" in (tmp_path / "help.txt").read_text() and (tmp_path / "out.json").is_file()
    assert not (ROOT / "out.json").exists() and not (ROOT / "help.txt").exists()
    # plain tools from here: the runner's reporting does not depend on our CLI
    failure = run_shell("true\nsh -c 'echo oops; exit 3' | cat\necho never\n", tmp_path, env)
    assert failure.startswith("line 2: `sh -c 'echo oops; exit 3' | cat` exited 3"), failure
    assert "oops" in failure and "never" not in failure
    failure = run_shell("true\nsh -c 'exit 4' \\\n  ignored\n", tmp_path, env)
    assert failure.startswith("line 2: `sh -c 'exit 4' ignored` exited 4"), failure
    assert run_shell("sleep 30", tmp_path, env, timeout=0.5).startswith("still running after")


def test_console_blocks_run_only_their_prompt_lines():
    block = Block(ROOT / "README.md", 1, "console", "$ echo a \\\n  b\na b\n$ true\n", None)
    assert shell_script(block) == "echo a \\\n  b\ntrue\n"


def test_skip_reason_naming_a_missing_test_fails():
    block = Block(ROOT / "docs/PPO.md", 1, "bash", "true\n", "slow; tests/test_ppo_ppo.py::test_no_such_test runs it")
    with pytest.raises(AssertionError, match="has no test test_no_such_test"):
        _check_skip_reason(block)
    _check_skip_reason(
        Block(ROOT / "docs/PPO.md", 1, "bash", "true\n", "slow; tests/test_ppo_ppo.py::test_cli_ppo_json_and_bad_input")
    )
