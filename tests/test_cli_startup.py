"""Commands that train nothing import no torch (issue 37, item 8).

Each command runs in a fresh interpreter (torch, once imported, stays in
``sys.modules``), through the same ``main`` the ``genesis-fp16`` script calls,
against an empty state dir with one agent enabled; the check is what that
interpreter imported, not a timing (the start-up time is a benchmark figure in
docs/PERFORMANCE.md, "Start-up").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# run `main(argv)`, then report the exit code and whether torch (or numpy) got imported
PROBE = """
import json, sys
import genesis_fp16.cli as cli
code = 0
try:
    cli.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code or 0
print(json.dumps({"code": code, "torch": "torch" in sys.modules}), file=sys.stderr)
"""

COMMANDS = [
    ["--help"],
    ["rollout", "status"],
    ["rollout", "status", "--json"],
    ["rollout", "history"],
    ["rollout", "enable", "agent-b", "--reason", "startup test"],
    ["rollout", "disable", "agent-b"],
    ["rollout", "rollback", "agent-a", "--reason", "startup test"],
    ["rollout", "reset", "agent-b"],
    ["profiles", "show"],
    ["profiles", "show", "agent-a"],
    ["state", "list"],
    ["trainers"],
    ["trainers", "--json"],
    ["evolve", "--help"],
    ["eval", "--help"],
    ["bench", "--help"],
    ["ppo", "--help"],
    ["forensics", "--help"],
]


def run(args: list[str], env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    try:
        return {**json.loads(last), "stdout": proc.stdout, "stderr": proc.stderr}
    except json.JSONDecodeError:
        pytest.fail(f"genesis-fp16 {' '.join(args)} did not finish: rc {proc.returncode}\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    state = tmp_path_factory.mktemp("state")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENESIS_FP16_")}
    env.update(GENESIS_FP16_STATE_DIR=str(state), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", COLUMNS="200")
    enabled = run(["rollout", "enable", "agent-a", "--reason", "startup test"], env)  # a ledger with a record in it
    assert enabled["code"] == 0, enabled["stderr"]
    return env


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_command_that_trains_nothing_imports_no_torch(args: list[str], env: dict[str, str]) -> None:
    result = run(args, env)
    assert result["code"] == 0, result["stderr"]
    assert not result["torch"], f"genesis-fp16 {' '.join(args)} imported torch"


def test_package_imports_torch_only_for_the_trainer(env: dict[str, str]) -> None:
    probe = (
        "import sys, genesis_fp16, agents, agents.tasks, agents.ppo, genesis_fp16_tools.bench\n"
        "before = 'torch' in sys.modules\n"
        "from genesis_fp16 import FP16Trainer, FP16TrainingConfig, CheckpointError\n"
        "from genesis_fp16.training.checkpoint import CheckpointError as Old\n"
        "assert CheckpointError is Old and FP16Trainer.__name__ == 'FP16Trainer'\n"
        "assert set(genesis_fp16.__all__) <= set(dir(genesis_fp16))\n"
        "print(before, 'torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


def test_unknown_package_attribute_is_an_attribute_error() -> None:
    import genesis_fp16

    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        genesis_fp16.NoSuchName  # noqa: B018
