"""ReplayBuffer: round trip, concurrent writers, a killed writer, corruption, locks, async."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import threading
import time

import numpy as np
import pytest

from infrastructure.replay_buffer import ReplayBuffer, ReplayBufferError, Trajectory


def _traj(seed: int, length: int = 5, candidate: str = "c") -> Trajectory:
    rng = np.random.default_rng(seed)
    return Trajectory(
        obs=rng.normal(size=(length, 3)),
        action=rng.normal(size=(length, 1)),
        reward=rng.normal(size=length),
        next_obs=rng.normal(size=(length, 3)),
        done=np.arange(length) == length - 1,
        candidate=candidate,
        outcome="probe",
    )


def test_round_trip_sample_count_export(tmp_path):
    buf = ReplayBuffer(tmp_path / "r.sqlite")
    t0, t1, t2 = _traj(0, candidate="a"), _traj(1, 7, candidate="b"), _traj(2, candidate="c")
    ids0 = buf.append_generation("agent", 0, [t0, t1])
    ids1 = buf.append_generation("agent", 1, [t2])
    buf.append_generation("other", 0, [_traj(3)])
    assert ids0 < ids1
    got = buf.sample("agent")
    assert [t.candidate for t in got] == ["c", "b", "a"]  # most recent first
    back = {t.candidate: t for t in got}
    for orig in (t0, t1, t2):
        b = back[orig.candidate]
        for name in ("obs", "action", "reward", "next_obs", "done"):
            np.testing.assert_array_equal(getattr(b, name), getattr(orig, name))
        assert b.return_ == pytest.approx(float(orig.reward.sum()), rel=1e-6)
        assert b.outcome == "probe" and b.agent == "agent"
    assert [t.generation for t in got] == [1, 0, 0]
    assert buf.count("agent") == {"trajectories": 3, "transitions": 17, "generations": 2}
    assert buf.count()["trajectories"] == 4
    assert [t.candidate for t in buf.sample("agent", limit=1)] == ["c"]
    assert [t.candidate for t in buf.sample("agent", min_generation=1)] == ["c"]
    assert len(buf.sample("agent", max_transitions=6)) == 2  # 5 + 7 >= 6 stops after the second
    out = buf.export(tmp_path / "export.jsonl", agent="agent")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["candidate"] for r in rows] == ["a", "b", "c"]
    np.testing.assert_allclose(rows[1]["reward"], t1.reward, rtol=1e-6)


def test_delete_trajectories_removes_exactly_those_ids(tmp_path):
    buf = ReplayBuffer(tmp_path / "r.sqlite")
    a0, a1, a2 = buf.append_generation(
        "a", 0, [_traj(0, candidate="x"), _traj(1, candidate="y"), _traj(2, candidate="z")]
    )
    (b0,) = buf.append_generation("b", 0, [_traj(3, candidate="w")])
    assert buf.delete_trajectories([a1, b0, a1]) == 2  # across agents; a repeated id counts once
    assert [t.candidate for t in buf.sample("a")] == ["z", "x"] and buf.sample("b") == []
    assert buf.delete_trajectories([]) == 0


def test_delete_trajectories_with_an_unknown_id_deletes_nothing(tmp_path):
    buf = ReplayBuffer(tmp_path / "r.sqlite")
    ids = buf.append_generation("a", 0, [_traj(0), _traj(1)])
    unknown = max(ids) + 100
    with pytest.raises(ValueError, match=rf"no trajectory with id {unknown}; nothing was deleted"):
        buf.delete_trajectories([ids[0], unknown])
    assert sorted(t.id for t in buf.sample("a")) == ids  # the known id survived: one transaction


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="inconsistent transition shapes"):
        Trajectory(
            obs=np.zeros((4, 3)),
            action=np.zeros((4, 1)),
            reward=np.zeros(3),
            next_obs=np.zeros((4, 3)),
            done=np.zeros(4),
        )


@pytest.mark.parametrize(
    "name, value",
    [("next_obs", np.nan), ("reward", 1e39), ("obs", -np.inf), ("action", np.nan), ("reward", -1e38), ("obs", 2e15)],
)
def test_a_non_finite_trajectory_is_refused_when_made(name, value):
    """1e39 is finite in float64 but inf as float32, the dtype it is stored in; 1e38 is finite in float32 but beyond
    what the learners' float32 statistics can hold (MAX_MAGNITUDE)."""
    arrays = {"obs": np.zeros((5, 3)), "action": np.zeros((5, 1)), "reward": np.zeros(5), "next_obs": np.zeros((5, 3))}
    arrays[name][3] = value
    with pytest.raises(
        ValueError,
        match=rf"trajectory 'c': non-finite {name} at transition 3 \(NaN or inf as float32, or beyond \+-1e\+15\)",
    ):
        Trajectory(**arrays, done=np.zeros(5, bool), candidate="c")


def test_append_refuses_a_generation_holding_non_finite_data_and_writes_none_of_it(tmp_path):
    buf = ReplayBuffer(tmp_path / "r.sqlite")
    kept = buf.append_generation("a", 0, [_traj(0, candidate="x")])
    good, bad = _traj(1, candidate="y"), _traj(2, candidate="z")
    bad.next_obs[4, 1] = np.nan  # changed after it was made, as a caller may
    with pytest.raises(
        ValueError,
        match=r"trajectory 1 of the generation \(candidate 'z'\): non-finite next_obs at transition 4.*"
        r"refusing to store generation 1 of agent 'a', nothing of it was written",
    ):
        buf.append_generation("a", 1, [good, bad])
    bad.next_obs[4, 1] = 0.0
    bad.reward[2] = np.float32(np.inf)
    with pytest.raises(ValueError, match="non-finite reward at transition 2"):
        buf.append("a", 1, bad)
    assert [t.id for t in buf.sample("a")] == kept and buf.count("a") == {
        "trajectories": 1,
        "transitions": 5,
        "generations": 1,
    }


def test_a_database_written_before_the_check_stays_readable(tmp_path):
    """Rows holding NaN from before the check are read back (training then
    names them, NonFiniteDataError, and delete_trajectories removes them)."""
    buf = ReplayBuffer(tmp_path / "r.sqlite")
    (tid,) = buf.append_generation("a", 0, [_traj(0)])
    with sqlite3.connect(buf.path) as conn:
        conn.execute("UPDATE trajectories SET reward = ? WHERE id = ?", (np.full(5, np.nan, "<f4").tobytes(), tid))
    (old,) = buf.sample("a")
    assert old.id == tid and np.isnan(old.reward).all()
    assert buf.delete_trajectories([tid]) == 1


def _writer(path: str, agent: str, generations: int) -> None:
    buf = ReplayBuffer(path, busy_timeout_s=0.05)  # short busy timeout: tenacity does the waiting
    for g in range(generations):
        buf.append_generation(agent, g, [_traj(g, candidate=f"{agent}-{g}-{k}") for k in range(3)])


def test_concurrent_writers_threads_and_processes(tmp_path):
    path = str(tmp_path / "r.sqlite")
    ReplayBuffer(path)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, f"p{i}", 8)) for i in range(2)]
    threads = [threading.Thread(target=_writer, args=(path, f"t{i}", 8)) for i in range(3)]
    for w in procs + threads:
        w.start()
    for w in threads:
        w.join(60)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    buf = ReplayBuffer(path)
    for agent in ["p0", "p1", "t0", "t1", "t2"]:
        assert buf.count(agent) == {"trajectories": 24, "transitions": 120, "generations": 8}


def _killed_writer(path: str) -> None:
    buf = ReplayBuffer(path)
    buf.append_generation("a", 0, [_traj(0), _traj(1)])

    def write_then_die(conn: sqlite3.Connection) -> None:
        buf_rows = [_traj(2)]
        for t in buf_rows:
            conn.execute(
                "INSERT INTO trajectories (agent, generation, candidate, return, outcome, length, obs_dim, act_dim,"
                " obs, action, reward, next_obs, done, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    "a",
                    1,
                    "doomed",
                    0.0,
                    "",
                    5,
                    3,
                    1,
                    t.obs.tobytes(),
                    t.action.tobytes(),
                    t.reward.tobytes(),
                    t.next_obs.tobytes(),
                    t.done.tobytes(),
                    0.0,
                ),
            )
        os.kill(os.getpid(), signal.SIGKILL)  # killed before COMMIT

    buf._run(write_then_die, write=True)


def test_killed_writer_loses_only_uncommitted_generation(tmp_path):
    path = str(tmp_path / "r.sqlite")
    proc = multiprocessing.get_context("fork").Process(target=_killed_writer, args=(path,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    buf = ReplayBuffer(path)
    assert buf.count("a") == {"trajectories": 2, "transitions": 10, "generations": 1}
    assert all(t.generation == 0 for t in buf.sample("a"))
    buf.append_generation("a", 1, [_traj(5)])  # the database is usable afterwards
    assert buf.count("a")["generations"] == 2


def test_corrupt_file_gives_clear_error(tmp_path):
    path = tmp_path / "r.sqlite"
    path.write_bytes(b"this is not an sqlite database, just garbage " * 100)
    with pytest.raises(ReplayBufferError) as err:
        ReplayBuffer(path)
    assert str(path) in str(err.value) and "corrupt" in str(err.value)


def test_locked_database_is_retried(tmp_path):
    path = tmp_path / "r.sqlite"
    buf = ReplayBuffer(path, busy_timeout_s=0.01)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # hold the write lock
    released = threading.Event()

    def release() -> None:
        time.sleep(0.4)
        holder.execute("COMMIT")
        released.set()

    threading.Thread(target=release).start()
    buf.append("a", 0, _traj(0))  # fails with "database is locked" until tenacity's retry succeeds
    assert released.is_set()
    assert buf.count("a")["trajectories"] == 1
    holder.close()


async def test_async_methods_do_not_block_the_loop(tmp_path):
    buf = ReplayBuffer(tmp_path / "r.sqlite")
    ids = await buf.aappend_generation("a", 0, [_traj(k, 200) for k in range(20)])
    assert len(ids) == 20
    got = await buf.asample("a", limit=5)
    assert len(got) == 5 and (await buf.acount("a"))["transitions"] == 4000


def test_full_disk_is_reported_as_such_not_as_corruption(tmp_path):
    """SQLite rolls a transaction back by itself on SQLITE_FULL; the error
    must still name the cause (not 'cannot rollback', not 'corrupt: move it aside')."""
    path = tmp_path / "r.sqlite"
    buf = ReplayBuffer(path)
    buf.append_generation("a", 0, [_traj(0)])
    pages = sqlite3.connect(path).execute("PRAGMA page_count").fetchone()[0]
    connect = buf._connect

    def small_disk() -> sqlite3.Connection:
        conn = connect()
        conn.execute(f"PRAGMA max_page_count={pages + 2}")
        return conn

    buf._connect = small_disk
    with pytest.raises(ReplayBufferError) as err:
        buf.append_generation("a", 1, [_traj(k, 2000) for k in range(5)])
    message = str(err.value)
    assert str(path) in message and "full" in message, message
    assert "corrupt" not in message and "cannot rollback" not in message, message
    buf._connect = connect
    assert buf.count("a") == {"trajectories": 1, "transitions": 5, "generations": 1}  # generation 0 kept
