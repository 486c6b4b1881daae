"""`genesis-fp16 state list|prune`: runs with their size; pruning by count
and age deletes a run's replay rows, world-model folder and manifest, never
the rollout ledger, the event log or a running run. A run's folder under
``world_model/`` holds its world model's and its critic's snapshots."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from agents.runs import RunLock, parse_duration, write_manifest
from agents.se_darwin_agent import SEDarwinAgent
from genesis_fp16.cli import app
from genesis_fp16.rollout.ledger import RolloutLedger
from genesis_fp16.base.settings import load_settings
from infrastructure.replay_buffer import ReplayBuffer, ReplayBufferError, Trajectory
from tests.test_resume import InProcessEvaluator, config

runner = CliRunner()
DAY = 86400.0


def make_run(state_dir, run_id: str, age_s: float, *, manifest: bool = True, trajectories: int = 3) -> None:
    """A run's three pieces, small: replay rows, a folder with world-model and critic snapshots, a manifest."""
    agent = f"se_darwin:{run_id}"
    t = 50
    rows = [
        Trajectory(
            obs=np.zeros((t, 3)),
            action=np.zeros((t, 1)),
            reward=np.zeros(t),
            next_obs=np.ones((t, 3)),
            done=np.zeros(t),
            candidate=f"g0-{k}-seed",
        )
        for k in range(trajectories)
    ]
    ReplayBuffer(state_dir / "replay.sqlite").append_generation(agent, 0, rows)
    folder = state_dir / "world_model" / run_id
    folder.mkdir(parents=True)
    (folder / "world_model-g0000.pt").write_bytes(b"\0" * 4096)
    (folder / "critic-g0000.pt").write_bytes(b"\0" * 1024)
    if manifest:
        write_manifest(
            state_dir,
            {
                "run_id": run_id,
                "data_agent": agent,
                "status": "interrupted",
                "started": time.time() - age_s,
                "generation": 0,
                "real_episodes": trajectories,
                "config": {},
                "world_model_checkpoint": "world_model-g0000.pt",
                "critic_checkpoint": "critic-g0000.pt",
            },
        )


def listed(args=()) -> dict:
    result = runner.invoke(app, ["state", "list", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def three_runs(state_dir):
    for run_id, age in (("seed0-old", 3 * DAY), ("seed0-mid", 2 * DAY), ("seed0-new", 1 * DAY)):
        make_run(state_dir, run_id, age)
    RolloutLedger.from_settings(load_settings()).rollback("world_model", reason="kept")  # the ledger holds history
    (state_dir / "events.jsonl").write_text('{"event": "x"}\n')
    return state_dir


def ledger_rows(state_dir) -> list:
    return [tuple(r) for r in RolloutLedger.from_settings(load_settings()).history("world_model")]


async def test_list_shows_runs_with_sizes(state_dir):
    agent = SEDarwinAgent(config(budget=24), settings=load_settings(), evaluator=InProcessEvaluator(workers=1))
    await agent.evolve()
    legacy = "seed3-20200101T000000-abcdef"
    make_run(state_dir, legacy, 0, manifest=False)  # replay rows and a folder, no manifest: started is in the id
    data = listed()
    runs = {r["run_id"]: r for r in data["runs"]}
    assert list(runs) == [agent.run_id, legacy]  # newest first
    real = runs[agent.run_id]
    assert (
        real["status"] == "finished"
        and real["real_episodes"] == 24
        and real["generation"] == len(agent.generations) - 1 >= 2
    )
    assert real["replay_trajectories"] == 24 and real["replay_bytes"] > 24 * 200 * 4 * 8  # 24 episodes of 200 steps
    folder = (
        state_dir / "world_model" / agent.run_id
    )  # both learners' own checkpoints (a finished run's snapshots are gone)
    learned = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert {"world_model.Pendulum-v1.pt", "critic.Pendulum-v1.pt"} <= set(learned), learned
    assert real["world_model_bytes"] == sum(learned.values()) > 0 and real["manifest_bytes"] > 0
    assert real["bytes"] == real["replay_bytes"] + real["world_model_bytes"] + real["manifest_bytes"]
    assert (
        runs[legacy]["status"] == "unknown"
        and runs[legacy]["replay_trajectories"] == 3
        and runs[legacy]["world_model_bytes"] == 4096 + 1024
    )
    assert runs[legacy]["started"] == time.mktime((2020, 1, 1, 0, 0, 0, 0, 0, -1))
    assert set(data["totals"]) == {"events", "replay_db", "ledger", "world_models", "manifests"}
    assert data["totals"]["replay_db"] >= (state_dir / "replay.sqlite").stat().st_size > 0
    table = runner.invoke(app, ["state", "list"])
    assert (
        table.exit_code == 0
        and agent.run_id in table.output
        and "finished" in table.output
        and "rollout ledger" in table.output
    )


def test_list_of_an_empty_state_dir_creates_nothing(state_dir):
    assert listed()["runs"] == []
    assert not (state_dir / "replay.sqlite").exists()


def test_prune_keep_one_leaves_the_newest_run_and_the_ledger(three_runs):
    state_dir = three_runs
    ledger_before = ledger_rows(state_dir)
    events_before = (state_dir / "events.jsonl").read_bytes()
    result = runner.invoke(app, ["state", "prune", "--keep", "1"])
    assert result.exit_code == 0, result.output
    assert (
        "deleted seed0-old" in result.output
        and "deleted seed0-mid" in result.output
        and "pruned 2 run(s), 6 trajectories" in result.output
    )
    assert [r["run_id"] for r in listed()["runs"]] == ["seed0-new"]
    assert ReplayBuffer(state_dir / "replay.sqlite").agents() == ["se_darwin:seed0-new"]
    assert {p.name for p in (state_dir / "world_model" / "seed0-new").iterdir()} == {
        "world_model-g0000.pt",
        "critic-g0000.pt",
    }
    assert (state_dir / "runs" / "seed0-new" / "run.json").is_file()
    assert not (state_dir / "world_model" / "seed0-old").exists() and not (state_dir / "runs" / "seed0-old").exists()
    assert ledger_rows(state_dir) == ledger_before and ledger_before  # the ledger is never pruned
    assert (
        (state_dir / "events.jsonl").read_bytes().startswith(events_before)
    )  # appended to (the prune event), never cut


def test_prune_older_than(three_runs):
    result = runner.invoke(app, ["state", "prune", "--older-than", "36h", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert sorted(r["run_id"] for r in report["deleted"]) == ["seed0-mid", "seed0-old"] and report["replay_rows"] == 6
    assert [r["run_id"] for r in listed()["runs"]] == ["seed0-new"]
    # with both, a run goes only if both say so: the newest 2 are kept, the oldest is past 36h
    make_run(three_runs, "seed0-older", 4 * DAY)
    report = json.loads(runner.invoke(app, ["state", "prune", "--keep", "2", "--older-than", "1h", "--json"]).stdout)
    assert [r["run_id"] for r in report["deleted"]] == []  # only 2 runs are left
    report = json.loads(runner.invoke(app, ["state", "prune", "--keep", "1", "--older-than", "3d", "--json"]).stdout)
    assert [r["run_id"] for r in report["deleted"]] == ["seed0-older"]


def test_dry_run_deletes_nothing(three_runs):
    before = listed()
    result = runner.invoke(app, ["state", "prune", "--keep", "0", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert (
        "would delete seed0-old" in result.output
        and "dry run: 3 run(s)" in result.output
        and "nothing deleted" in result.output
    )
    assert listed() == before


def test_running_run_is_never_pruned(three_runs):
    holder = RunLock(three_runs, "seed0-old")
    assert holder.acquire()
    try:
        assert {r["run_id"]: r["status"] for r in listed()["runs"]}["seed0-old"] == "running"
        result = runner.invoke(app, ["state", "prune", "--keep", "0"])
        assert result.exit_code == 0, result.output
        assert [r["run_id"] for r in listed()["runs"]] == ["seed0-old"]
        assert (three_runs / "runs" / "seed0-old" / "run.json").is_file()
    finally:
        holder.release()
    assert listed()["runs"][0]["status"] == "interrupted"


def test_vacuum_shrinks_the_replay_database(state_dir):
    for k in range(3):
        make_run(state_dir, f"seed0-r{k}", (3 - k) * DAY, trajectories=40)
    result = runner.invoke(app, ["state", "prune", "--keep", "0", "--vacuum", "--json"])
    assert result.exit_code == 0, result.output
    sizes = json.loads(result.stdout)["replay_db_bytes"]
    assert sizes["after"] < sizes["before"] / 4


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--older-than", "7x"],
            "--older-than: duration '7x': expected a number and a unit s, m, h, d or w (e.g. 12h, 7d)",
        ),
        (["--older-than", "-1d"], "expected a number and a unit"),
        ([], "give --keep N and/or --older-than DURATION"),
        (["--keep", "-1"], "greater than or equal to 0"),
    ],
)
def test_bad_input_one_clear_error(three_runs, args, expected):
    result = runner.invoke(app, ["state", "prune", *args])
    assert result.exit_code == 2
    assert expected in result.output and "Traceback" not in result.output
    assert len(listed()["runs"]) == 3


def test_parse_duration():
    assert [parse_duration(t) for t in ("90s", "30m", "12h", "7d", "2w", "1.5h")] == [
        90,
        1800,
        43200,
        604800,
        1209600,
        5400,
    ]


# -- a read-only state dir ---------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _read_only_mount_works(path: Path) -> bool:
    probe = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            'mount --bind -o ro "$0" "$0" && ! touch "$0/probe" 2>/dev/null',
            str(path),
        ],
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0 and not (path / "probe").exists()


def cli_on_read_only(state_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a mount namespace where ``state_dir`` is a read-only bind
    mount: writes fail with EROFS even for root (which ignores chmod)."""
    if shutil.which("unshare") is None or not _read_only_mount_works(state_dir):
        pytest.skip(
            "needs `unshare --user --mount` and a bind mount (Linux, user namespaces allowed) for a truly read-only dir"
        )
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    return subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            script,
            str(state_dir),
            sys.executable,
            "-m",
            "genesis_fp16.cli",
            *args,
        ],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )


def tree(path: Path) -> dict:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


def test_list_and_dry_run_work_on_a_read_only_state_dir(three_runs):
    """Listing is a read: `state list` and `state prune --dry-run` answer on a
    read-only state dir (no schema set-up, no lock file opened for writing)."""
    expected = listed()
    before = tree(three_runs)
    shown = cli_on_read_only(three_runs, "state", "list", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == expected
    table = cli_on_read_only(three_runs, "state", "list")
    assert table.returncode == 0 and "seed0-old" in table.stdout and "replay database" in table.stdout, table.stderr
    dry = cli_on_read_only(three_runs, "state", "prune", "--keep", "1", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert [r["run_id"] for r in json.loads(dry.stdout)["would_delete"]] == ["seed0-mid", "seed0-old"]
    assert tree(three_runs) == before


def test_a_running_run_in_a_read_only_state_dir_is_listed_running(three_runs):
    holder = RunLock(three_runs, "seed0-old")
    assert holder.acquire()
    try:
        shown = cli_on_read_only(three_runs, "state", "list", "--json")
        assert shown.returncode == 0, shown.stderr
        assert {r["run_id"]: r["status"] for r in json.loads(shown.stdout)["runs"]}["seed0-old"] == "running"
    finally:
        holder.release()


def test_prune_on_a_read_only_state_dir_is_one_clear_error(three_runs):
    before = tree(three_runs)
    result = cli_on_read_only(three_runs, "state", "prune", "--keep", "1")
    assert result.returncode == 2, result.stderr
    assert (
        "Traceback" not in result.stderr
        and "read-only file system" in result.stderr.lower()
        and "nothing was deleted" in result.stderr
    )
    assert tree(three_runs) == before


def test_a_read_only_replay_buffer_creates_nothing_and_refuses_writes(state_dir):
    make_run(state_dir, "seed0-a", 0)
    path = state_dir / "replay.sqlite"
    files = sorted(p.name for p in state_dir.iterdir())
    buffer = ReplayBuffer(path, read_only=True)
    assert buffer.usage()["se_darwin:seed0-a"]["trajectories"] == 3
    with pytest.raises(ReplayBufferError) as err:
        buffer.delete_agents(["se_darwin:seed0-a"])
    assert err.value.kind == "read_only"
    assert ReplayBuffer(path).count()["trajectories"] == 3
    with pytest.raises(ReplayBufferError):  # nothing there to read: created by no one
        ReplayBuffer(state_dir / "missing.sqlite", read_only=True)
    assert not (state_dir / "missing.sqlite").exists()
    assert files == sorted(
        p.name for p in state_dir.iterdir() if p.name not in ("replay.sqlite-wal", "replay.sqlite-shm")
    )


def _spoil(path: Path, how: str) -> str:
    """Put what ``how`` names at the manifest ``path`` (a FIFO, a link to /dev/zero, a 100,000-deep array, an edited
    field); what the error says about it."""
    if how == "fifo":
        path.unlink()
        os.mkfifo(path)
        return "the run manifest is a FIFO, expected a regular file"
    if how == "dev_zero":
        path.unlink()
        path.symlink_to("/dev/zero")
        return "the run manifest is a character device (a symlink to /dev/zero), expected a regular file"
    if how == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
        return "the run manifest is nested too deep to read"
    path.write_text(path.read_text().replace('"generation": 0', '"generation": 100000000000000000000'))
    return "field generation: 100000000000000000000; expected a whole number from"


@pytest.mark.timeout(30)
def test_one_unreadable_manifest_does_not_hide_the_other_runs(state_dir):
    """Issue 52 (D2): a FIFO as one run's manifest hung `state list`, a link to /dev/zero read without bound, a deep
    array raised RecursionError, and an unreadable one was listed as "unknown" without a word. Every run is listed,
    each unreadable one as such, named in one line on stderr with the file and the fix; the exit is 1 (as ls's)."""
    from agents.runs import manifest_path

    bad = ["fifo", "dev_zero", "deep", "huge"]
    for i, run_id in enumerate(["good", *bad]):
        write_manifest(
            state_dir,
            {
                "run_id": run_id,
                "status": "interrupted",
                "started": time.time() - i,
                "generation": 0,
                "real_episodes": 1,
                "config": {},
            },
        )
    said = {run_id: _spoil(manifest_path(state_dir, run_id), run_id) for run_id in bad}
    for args in (["--json"], []):
        result = runner.invoke(app, ["state", "list", *args], env={"COLUMNS": "300"})
        assert result.exit_code == 1, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        errors = result.stderr.splitlines()
        assert len(errors) == len(bad) and "Traceback" not in result.output, result.stderr
        for run_id in bad:
            line = next(e for e in errors if e.startswith(f"error: {manifest_path(state_dir, run_id)}: "))
            assert said[run_id] in line and "state prune" in line, line
        if args:
            runs = {r["run_id"]: r for r in json.loads(result.stdout)["runs"]}
            assert runs["good"]["status"] == "interrupted" and runs["good"]["problem"] is None
            assert {r: runs[r]["status"] for r in bad} == dict.fromkeys(bad, "unreadable")
            assert said["fifo"] in runs["fifo"]["problem"]
        else:
            assert "good" in result.stdout and result.stdout.count("unreadable") == len(bad)
