"""tune: event log -> per-agent profile proposals; --apply writes a valid
profile atomically with a backup."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from genesis_fp16.base import telemetry
from genesis_fp16.cli import app
from genesis_fp16.rollout.guard import RollbackGuard
from genesis_fp16.rollout.profiles import load_profiles, profile_layer
from genesis_fp16.training.registry import trainer_for
from genesis_fp16.base.settings import load_settings
from genesis_fp16.rollout.tuning import apply, propose, summarise

runner = CliRunner()


def _fp16_run_with_overflows(agent: str, every: int, steps: int = 40) -> None:
    """A real FP16 run whose every ``every``-th backward overflows; events go to the state dir's log."""
    settings = load_settings()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    trainer = trainer_for(
        agent, model, torch.optim.Adam(model.parameters(), lr=1e-2), settings=settings, precision="fp16"
    )
    guard = RollbackGuard(agent, settings=settings)
    guard.attach(trainer)
    count = {"n": 0}

    def hook(grad):
        count["n"] += 1
        return grad * float("inf") if count["n"] % every == 0 else grad

    model[0].weight.register_hook(hook)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(steps):
        trainer.backward_and_step(trainer.training_step((x, y), lambda m, b: ((m(b[0]).float() - b[1]) ** 2).mean()))
    guard.check(trainer)


def _ev(event, **fields):
    return {"event": event, "timestamp": "2026-01-01T00:00:00Z", **fields}


def test_generated_overflow_log_lowers_scale_and_lengthens_interval(state_dir):
    _fp16_run_with_overflows("noisy", every=4)  # 25% overflow: P2
    _fp16_run_with_overflows("clean", every=10_000)
    events = telemetry.read_events(state_dir / "events.jsonl")
    summary = summarise(events)
    assert summary["noisy"].judged_overflow_rate == pytest.approx(0.25)
    proposals = {p.agent: p for p in propose(events)}
    assert set(proposals) == {"noisy"}  # the clean agent needs nothing
    p = proposals["noisy"]
    assert p.changes["growth_interval"] == 4000 and p.current["growth_interval"] == 2000
    assert p.changes["init_scale"] <= 32768.0 and p.changes["init_scale"] <= summary["noisy"].min_scale
    assert any("overflow rate 25%" in r for r in p.reasons)


def test_heavy_overflow_quadruples_interval(state_dir):
    _fp16_run_with_overflows("storm", every=2)  # 50%: P1 rollback
    events = telemetry.read_events(state_dir / "events.jsonl")
    (p,) = propose(events)
    assert p.changes["growth_interval"] == 8000
    assert summarise(events)["storm"].rollbacks  # the guard's rollback is in the log


@pytest.mark.parametrize(
    "precisions, rollbacks, expected",
    [(["fp16"], 2, "bf16"), (["bf16"], 2, "fp32"), (["fp16"], 3, "fp32"), (["fp16"], 1, None)],
)
def test_repeated_rollbacks_move_precision(state_dir, precisions, rollbacks, expected):
    events = [
        _ev("trainer.step_skipped", trainer="a", precision=prec, reason="nonfinite_loss", step=1) for prec in precisions
    ]
    events += [
        _ev("rollout.stage_changed", agent="a", to_stage="rolled_back", reason=f"P0: storm {k}", actor="guard")
        for k in range(rollbacks)
    ]
    proposals = propose(events)
    if expected is None:
        assert proposals == []
    else:
        assert proposals[0].changes == {"precision": expected}
        assert f"{rollbacks} rollbacks" in proposals[0].reasons[0]


def test_rollbacks_in_fp16_do_not_push_a_healthy_bf16_agent_to_fp32(state_dir):
    # tune moved 'a' to BF16 after two FP16 rollbacks; BF16 then trained without a
    # rollback. The same (appended) event log must not now propose FP32.
    (state_dir / "profiles.toml").write_text('[agents.a]\nprecision = "bf16"\n')
    events = [_ev("trainer.step_skipped", trainer="a", precision="fp16", reason="nonfinite_loss", step=1)]
    events += [
        _ev("rollout.stage_changed", agent="a", to_stage="rolled_back", reason=f"P0: storm {k}") for k in range(2)
    ]
    events += [_ev("trainer.scale_changed", trainer="a", precision="bf16", step=5, new_scale=None)]
    assert propose(events) == []
    # one rollback in FP16 and one in BF16: FP32
    events = [
        _ev("trainer.step_skipped", trainer="a", precision="fp16", reason="nonfinite_loss", step=1),
        _ev("rollout.stage_changed", agent="a", to_stage="rolled_back", reason="P0"),
        _ev("trainer.step_skipped", trainer="a", precision="bf16", reason="nonfinite_loss", step=2),
        _ev("rollout.stage_changed", agent="a", to_stage="rolled_back", reason="P1"),
    ]
    (p,) = propose(events)
    assert p.changes == {"precision": "fp32"}


def test_throughput_recommendation_and_shadow_trainer_ignored(state_dir):
    events = [
        _ev(
            "guard.recommendation",
            agent="slow",
            changes={"precision": "fp32"},
            reason="reduced precision is slower than FP32 here",
        ),
        _ev("trainer.step_skipped", trainer="slow.fp32_shadow", precision="fp16", reason="overflow", step=50),
    ]
    (p,) = propose(events)
    assert p.agent == "slow" and p.changes == {"precision": "fp32"}


def test_proposal_already_in_profile_is_dropped(state_dir):
    (state_dir / "profiles.toml").write_text('[agents.a]\nprecision = "bf16"\n')
    events = [_ev("trainer.step_skipped", trainer="a", precision="fp16", reason="x", step=1)]
    events += [_ev("rollout.stage_changed", agent="a", to_stage="rolled_back", reason="r")] * 2
    assert propose(events) == []


def _canary(agent, ratio):
    return _ev("guard.canary", agent=agent, kind="val_loss", val_loss_ratio=ratio, alarm=ratio > 1.3, precision="bf16")


def test_a_rising_canary_gap_proposes_fp32(state_dir):
    events = [_canary("drifting", r) for r in (1.01, 1.05, 1.12, 1.2)]  # rising, last over half the 1.3x margin
    (p,) = propose(events)
    assert p.agent == "drifting" and p.changes == {"precision": "fp32"}
    assert any("canary gap rising" in r for r in p.reasons) and p.evidence["canary_ratios"] == [1.01, 1.05, 1.12, 1.2]


@pytest.mark.parametrize("ratios", [(1.01, 1.03, 1.02, 1.15), (1.01, 1.02, 1.03, 1.04), (1.15,)])
def test_a_noisy_or_small_canary_gap_proposes_nothing(state_dir, ratios):
    assert propose([_canary("fine", r) for r in ratios]) == []


def test_a_rollback_caught_by_a_canary_halves_canary_every_and_applies(state_dir):
    events = [
        _canary("wm", 1.5),
        _canary("wm", 1.6),
        _ev(
            "rollout.stage_changed",
            agent="wm",
            to_stage="rolled_back",
            reason="P1: validation loss 1.60x the FP32 canary, confirmed (> 1.30x)",
        ),
    ]
    (p,) = propose(events)
    assert p.changes == {"thresholds": {"canary_every": 2}}
    path = state_dir / "profiles.toml"
    path.write_text('[agents.wm]\nprecision = "bf16"\n[agents.wm.thresholds]\nmin_steps = 5\n')
    apply([p], path)
    layer = load_profiles(path).layer("wm")
    assert layer.thresholds == {"min_steps": 5, "canary_every": 2} and layer.values == {"precision": "bf16"}


def test_apply_writes_valid_profile_with_backup(state_dir):
    path = state_dir / "profiles.toml"
    path.write_text('[agents.keep]\nprecision = "fp32"\n')
    _fp16_run_with_overflows("noisy", every=4)
    proposals = propose(telemetry.read_events(state_dir / "events.jsonl"))
    result = apply(proposals, path)
    pf = load_profiles(path)
    assert pf.agents["keep"].values == {"precision": "fp32"}
    assert pf.agents["noisy"].values["growth_interval"] == 4000
    assert profile_layer("noisy", load_settings())["trainer"]["growth_interval"] == 4000
    assert result["backup"] and "keep" in open(result["backup"]).read()


def test_cli_tune_json_and_apply(state_dir):
    _fp16_run_with_overflows("noisy", every=4)
    log = state_dir / "events.jsonl"
    r = runner.invoke(app, ["tune", "--events", str(log), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["applied"] is None and data["proposals"][0]["agent"] == "noisy"
    assert not (state_dir / "profiles.toml").exists()  # a dry run writes nothing
    r = runner.invoke(app, ["tune", "--events", str(log), "--apply"])
    assert r.exit_code == 0 and "wrote" in r.stdout
    assert load_profiles(state_dir / "profiles.toml").agents["noisy"].values["growth_interval"] == 4000


def test_cli_tune_reads_the_state_dirs_event_log_by_default(state_dir, monkeypatch):
    r = runner.invoke(app, ["tune"])  # nothing trained yet: no log
    assert r.exit_code == 2 and str(state_dir / "events.jsonl") in r.output and "--events FILE" in r.output
    _fp16_run_with_overflows("noisy", every=4)
    r = runner.invoke(app, ["tune", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["events"] == str(state_dir / "events.jsonl") and data["proposals"][0]["agent"] == "noisy"


def test_cli_tune_bad_input(state_dir, tmp_path):
    r = runner.invoke(app, ["tune", "--events", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "does not exist" in r.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{not json}\n{"event": "x"}\n')
    r = runner.invoke(app, ["tune", "--events", str(bad)])
    assert r.exit_code == 2 and "bad.jsonl:1: not a JSON event line" in r.output


def test_cli_tune_a_line_that_is_not_utf8_is_one_error_naming_file_and_line(state_dir, tmp_path):
    """Issue 44: a non-UTF-8 line stopped tune with the codec's message, naming neither the file nor the line. It is
    told as a line that is not JSON is: an error with the file and the line in the middle, skipped as torn at the end.
    """
    good = json.dumps({"event": "x", "agent": "a"}).encode()
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(
        good
        + b"\n"
        + json.dumps({"event": "y", "reason": "caf\u00e9"}, ensure_ascii=False).encode("latin-1")
        + b"\n"
        + good
        + b"\n"
    )
    r = runner.invoke(app, ["tune", "--events", str(bad)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    assert f"{bad}:2: not UTF-8 text (byte 0xe9 at column 30)" in r.output and "delete or repair that line" in r.output
    assert r.output.count("\n") == 1 and "Traceback" not in r.output and "codec" not in r.output
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(good + b"\n" + '{"event": "\u00e9'.encode()[:-1])  # a write cut inside a two-byte character
    assert [e["event"] for e in telemetry.read_events(torn)] == ["x"]
    assert runner.invoke(app, ["tune", "--events", str(torn)]).exit_code == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "kind, said",
    [
        ("fifo", "event log {path} is a FIFO, expected a regular file; name the JSON-lines log"),
        ("dev_zero", "event log {path} is a character device (a symlink to /dev/zero), expected a regular file"),
        ("directory", "event log {path} is a directory, expected a regular file"),
        (
            "deep",
            "{path}:2: not a JSON event line: it is nested too deep to read (more than 32 levels); delete or repair",
        ),
        ("deep_last", "{path}:2: not a JSON event line: it is nested more than 32 levels deep; delete or repair"),
        (
            "list",
            "{path}:2: not a JSON event line: it holds a JSON list, expected an object; delete or repair that line",
        ),
        ("null", "{path}:2: not a JSON event line: it holds null, expected an object; delete or repair that line"),
    ],
)
def test_cli_tune_an_event_log_that_is_not_json_lines_of_objects_is_one_line(state_dir, kind, said):
    """Issue 52 (D12): a line that is not an object (``[1,2]``, ``null``) or is nested 100,000 deep crashed ``tune``;
    a FIFO as the log would hang it. Each is one line naming the file (and the line) and the fix. The default log,
    <state_dir>/events.jsonl, is read (no --events): a torn last line is still skipped, a deep one is not torn."""
    import os

    path = state_dir / "events.jsonl"
    good = json.dumps({"event": "trainer.step_skipped", "agent": "a", "reason": "overflow"})
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        bad = {
            "deep": "[" * 100_000 + "]" * 100_000,
            "deep_last": '{"a": ' + "[" * 40 + "]" * 40 + "}",
            "list": "[1, 2]",
            "null": "null",
        }[kind]
        path.write_text(f"{good}\n{bad}\n" + ("" if kind == "deep_last" else f"{good}\n"))
    r = runner.invoke(app, ["tune"], env={"COLUMNS": "400"})
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: " + said.format(path=path)) and r.output.count("\n") == 1, r.output
    assert "Traceback" not in r.output


def test_events_whose_fields_have_other_types_count_for_nothing():
    """Objects, but not as this code writes them (an edited log): no crash, no proposal from them."""
    events = [
        {"event": 5, "agent": "a"},
        {"event": "trainer.step_skipped", "agent": "a", "precision": ["fp16"]},
        {"event": "guard.decision", "agent": "a", "precision": "fp16", "training_steps": 10, "overflow_rate": "x"},
        {"event": "trainer.step_skipped", "agent": "a", "reason": "overflow"},
    ]
    summary = summarise(events)["a"]
    assert summary.overflow_skips == 1 and summary.judged_overflow_rate == 0.0 and summary.judged_steps == 10


# -- the event catalogue tune relies on ------------------------------------------------


def _events_in_source(root):
    """Dotted event names passed to logger calls anywhere in the project's code."""
    import ast
    import re

    name = re.compile(r"^[a-z][a-z0-9_]*\.[a-z0-9_.]+$")
    methods = {"info", "warning", "error", "debug", "critical", "exception", "_emit"}
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] not in ("genesis_fp16", "infrastructure", "agents", "scripts"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        consts = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f, args = node.func, node.args
            first = None
            if isinstance(f, ast.Name) and f.id == "log_once" and len(args) >= 4:
                first = args[3]
            elif args and (
                (isinstance(f, ast.Attribute) and f.attr in methods)
                or (isinstance(f, ast.Call) and isinstance(f.func, ast.Name) and f.func.id == "getattr")
            ):
                first = args[0]
            value = None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                value = first.value
            elif isinstance(first, ast.Name):
                value = consts.get(first.id)
            if value and name.match(value):
                found.setdefault(value, f"{rel}:{node.lineno}")
    return found


def test_events_catalogue_lists_every_event():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    catalogue = (root / "docs" / "EVENTS.md").read_text(encoding="utf-8")
    found = _events_in_source(root)
    assert {"trainer.step_skipped", "guard.rollback", "rollout.stage_changed", "checkpoint.fresh_scaler"} <= set(found)
    missing = {ev: where for ev, where in found.items() if f"`{ev}`" not in catalogue}
    assert not missing, f"events emitted in code but not in docs/EVENTS.md: {missing}"


def test_applying_the_same_log_twice_changes_the_profile_once(state_dir):
    path = state_dir / "profiles.toml"
    log = state_dir / "canary_events.jsonl"
    events = [
        _canary("wm", 1.5),
        _canary("wm", 1.6),
        _ev(
            "rollout.stage_changed",
            agent="wm",
            to_stage="rolled_back",
            reason="P1: validation loss 1.60x the FP32 canary, confirmed (> 1.30x)",
        ),
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    for _ in range(2):
        r = runner.invoke(app, ["tune", "--events", str(log), "--apply", "--profiles", str(path)])
        assert r.exit_code == 0, r.output
    assert load_profiles(path).agents["wm"].thresholds == {"canary_every": 2}  # 5 -> 2 once, not 2 -> 1
    assert "already applied" in r.stdout
    # a later event of the same kind is new evidence: acted on once more
    later = _ev("rollout.stage_changed", agent="wm", to_stage="rolled_back", reason="P1: canary, confirmed")
    later["timestamp"] = "2026-01-02T00:00:00.500000Z"
    with log.open("a") as f:
        f.write(json.dumps(later) + "\n")
    assert runner.invoke(app, ["tune", "--events", str(log), "--apply", "--profiles", str(path)]).exit_code == 0
    assert load_profiles(path).agents["wm"].thresholds == {"canary_every": 1}


def test_applying_a_real_overflow_log_twice_through_the_api(state_dir):
    path = state_dir / "profiles.toml"
    _fp16_run_with_overflows("noisy", every=4)
    for _ in range(2):
        proposals = propose(telemetry.read_events(state_dir / "events.jsonl"), profiles_path=path)
        if proposals:
            apply(proposals, path)
    assert load_profiles(path).agents["noisy"].values["growth_interval"] == 4000  # not 8000
    assert propose(telemetry.read_events(state_dir / "events.jsonl"), profiles_path=path) == []
