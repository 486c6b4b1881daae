"""The drill's scenarios and `run_drill` (see the package docstring)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from genesis_fp16.base import telemetry
from genesis_fp16.training.checkpoint import load_payload
from genesis_fp16.rollout.guard import RollbackGuard
from genesis_fp16.training.registry import resolve_trainer, trainer_for
from genesis_fp16.rollout.ledger import RolloutLedger
from genesis_fp16.base.settings import Settings, load_settings
from genesis_fp16.rollout.drill import canary
from genesis_fp16.rollout.drill.common import REDUCED, ScenarioResult, drill_data, model_and_optimizer, mse


class Drill:
    """The scenarios, sharing one scratch state dir."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.settings = self._settings()
        # structlog loggers bind their configuration when created: point the
        # event log at the scratch dir before the ledger makes its logger. The
        # faults are injected on purpose: their events go to that log, not to
        # the terminal, where they would read as real trouble
        telemetry.configure_logging(self.settings, force=True, quiet_console=True)
        self.ledger = RolloutLedger.from_settings(self.settings)
        self.batch = drill_data()

    def _settings(self) -> Settings:
        profiles = self.state_dir / "profiles.toml"
        if not profiles.exists():
            profiles.write_text("[defaults.thresholds]\nmin_steps = 10\n", encoding="utf-8")
        return load_settings(
            state_dir=self.state_dir,
            profiles_file=profiles,
            enable_fp16_training=True,
            precision="auto",
            distributed="none",
            nonfinite_streak_threshold=3,
            log_level="WARNING",
        )

    def _trainer(self, agent: str, model: nn.Module, opt: torch.optim.Optimizer, precision: Optional[str] = REDUCED):
        return trainer_for(agent, model, opt, settings=self.settings, precision=precision)

    # -- scenarios ---------------------------------------------------------------
    def nan_storm(self) -> ScenarioResult:
        """P0: NaN losses -> guard rolls back at once, last good checkpoint restored, training goes on in FP32."""
        agent = "drill_nan_storm"
        self.ledger.enable(agent, actor="drill", reason="drill: nan storm")
        model, opt = model_and_optimizer()
        trainer = self._trainer(agent, model, opt)
        guard = RollbackGuard(agent, settings=self.settings, ledger=self.ledger)
        guard.attach(trainer)
        checks: dict[str, Any] = {"precision_before": trainer.precision.name}
        for _ in range(8):
            trainer.backward_and_step(trainer.training_step(self.batch, mse))
        good = trainer.save_checkpoint(self.state_dir / f"{agent}.good.pt")
        guard.record_good_checkpoint(good)
        good_weights = {k: v.clone() for k, v in model.state_dict().items()}
        storm_steps = 0
        for _ in range(20):  # the storm: every loss NaN, until the guard trips
            loss = trainer.training_step(self.batch, mse) * float("nan")
            trainer.backward_and_step(loss)
            storm_steps += 1
            if guard.tripped is not None:
                break
        trip = guard.tripped
        checks.update(
            tripped=trip is not None,
            storm_steps=storm_steps,
            severity=trip.severity if trip else None,
            restore=trip.restore_checkpoint if trip else None,
        )
        history = self.ledger.history(agent)
        checks["ledger_stage"] = self.ledger.stage(agent)
        checks["ledger_reason"] = history[-1]["reason"] if history else None
        # what WorldModel does on a trip: rebuild through the policy, restore the last good checkpoint
        trainer = self._trainer(agent, model, opt)
        trainer.load_checkpoint(guard.last_good_checkpoint, restore_rng=False)
        checks["precision_after"] = trainer.precision.name
        checks["weights_restored"] = all(torch.equal(good_weights[k], v) for k, v in model.state_dict().items())
        guard.attach(trainer)
        guard.reset()
        oks = [trainer.backward_and_step(trainer.training_step(self.batch, mse)) for _ in range(10)]
        with torch.no_grad():
            final = float(mse(model, self.batch))
        checks.update(steps_after=sum(oks), final_loss=final)
        passed = (
            trip is not None
            and trip.severity == "P0"
            and trip.action == "rollback"
            and trip.restore_checkpoint
            and storm_steps == self.settings.nonfinite_streak_threshold
            and checks["ledger_stage"] == "rolled_back"
            and "non-finite" in (checks["ledger_reason"] or "")
            and checks["precision_after"] == "fp32"
            and checks["weights_restored"]
            and all(oks)
            and math.isfinite(final)
        )
        detail = (
            f"{checks['precision_before']} -> tripped {checks['severity']} after {storm_steps} NaN steps, "
            f"ledger {checks['ledger_stage']}, restored={checks['weights_restored']}, "
            f"{sum(oks)}/10 steps in {checks['precision_after']}, loss {final:.4f}"
        )
        return ScenarioResult("nan_storm", bool(passed), detail, 0.0, checks)

    def _overflow_run(self, agent: str, every: int, steps: int = 30):
        """FP16 with a scaler; every ``every``-th backward puts inf in a gradient
        (what an FP16 overflow is to the scaler)."""
        self.ledger.enable(agent, actor="drill", reason="drill: overflow")
        model, opt = model_and_optimizer()
        trainer = self._trainer(agent, model, opt, precision="fp16")
        guard = RollbackGuard(agent, settings=self.settings, ledger=self.ledger)
        guard.attach(trainer)
        counter = {"n": 0}

        def poison(grad: torch.Tensor) -> torch.Tensor:
            counter["n"] += 1
            return grad * float("inf") if counter["n"] % every == 0 else grad

        handle = model.net[0].weight.register_hook(poison)
        try:
            for _ in range(steps):
                trainer.backward_and_step(trainer.training_step(self.batch, mse))
        finally:
            handle.remove()
        return trainer, guard, guard.check(trainer)

    def overflow_storm(self) -> ScenarioResult:
        """P1: overflow rate over 30% -> rollback, next trainer FP32."""
        agent = "drill_overflow_storm"
        trainer, guard, decision = self._overflow_run(agent, every=2)
        stats = trainer.get_stats()
        after = self._trainer(agent, *model_and_optimizer())
        checks = {
            "precision": stats["precision"],
            "overflow_rate": stats["overflow_rate"],
            "severity": decision.severity,
            "action": decision.action,
            "ledger_stage": self.ledger.stage(agent),
            "precision_after": after.precision.name,
        }
        passed = (
            stats["precision"] == "fp16"
            and stats["overflow_rate"] > 0.30
            and decision.severity == "P1"
            and decision.action == "rollback"
            and checks["ledger_stage"] == "rolled_back"
            and checks["precision_after"] == "fp32"
        )
        detail = (
            f"overflow rate {stats['overflow_rate']:.0%} -> {decision.severity} {decision.action}, "
            f"ledger {checks['ledger_stage']}, next trainer {checks['precision_after']}"
        )
        return ScenarioResult("overflow_storm", bool(passed), detail, 0.0, checks)

    def overflow_warning(self) -> ScenarioResult:
        """P2: overflow rate 10-30% -> warn and recommend, no rollback."""
        agent = "drill_overflow_warning"
        trainer, guard, decision = self._overflow_run(agent, every=5)
        stats = trainer.get_stats()
        recs = self.ledger.recommendations(agent)
        checks = {
            "overflow_rate": stats["overflow_rate"],
            "severity": decision.severity,
            "action": decision.action,
            "ledger_stage": self.ledger.stage(agent),
            "recommendation": decision.recommendation,
        }
        passed = (
            0.10 < stats["overflow_rate"] <= 0.30
            and decision.severity == "P2"
            and decision.action == "warn"
            and checks["ledger_stage"] == "on"
            and len(recs) == 1
            and "init_scale" in recs[0]["changes"]
        )
        detail = (
            f"overflow rate {stats['overflow_rate']:.0%} -> {decision.severity} {decision.action}, "
            f"ledger {checks['ledger_stage']}, recommendation {recs[-1]['changes'] if recs else None}"
        )
        return ScenarioResult("overflow_warning", bool(passed), detail, 0.0, checks)

    def killed_while_saving(self) -> ScenarioResult:
        """A process killed (SIGKILL) in the middle of writing a checkpoint leaves the previous one loadable."""
        path = self.state_dir / "drill_kill.pt"
        model, opt = model_and_optimizer(seed=1)
        trainer = self._trainer("drill_kill", model, opt, precision="fp32")
        trainer.backward_and_step(trainer.training_step(self.batch, mse))
        trainer.save_checkpoint(path)
        before = path.read_bytes()
        code = (
            "import sys, time\n"
            "from genesis_fp16.base.storage import atomic_write\n"
            "def write(fh):\n"
            "    fh.write(b'\\x00' * (1 << 20)); fh.flush()\n"
            "    print('writing', flush=True); time.sleep(60)\n"
            f"atomic_write({str(path)!r}, write)\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self._child_env()
        )
        try:
            line = proc.stdout.readline().decode().strip() if proc.stdout else ""
            temps = list(path.parent.glob(f".{path.name}.*.tmp"))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        checks: dict[str, Any] = {
            "child_was_writing": line == "writing",
            "temp_files_during_write": len(temps),
            "returncode": proc.returncode,
            "file_unchanged": path.read_bytes() == before,
        }
        try:
            payload = load_payload(path)
            checks["loads"] = True
            fresh, fresh_opt = model_and_optimizer(seed=2)
            self._trainer("drill_kill", fresh, fresh_opt, precision="fp32").apply_payload(payload, source=str(path))
            checks["weights_match"] = all(
                torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values())
            )
        except Exception as exc:
            checks.update(loads=False, weights_match=False, error=str(exc))
        for tmp in temps:  # the dead writer's leftover, as an operator would remove it
            tmp.unlink(missing_ok=True)
        passed = (
            checks["child_was_writing"]
            and checks["temp_files_during_write"] >= 1
            and proc.returncode == -signal.SIGKILL
            and checks["file_unchanged"]
            and checks["loads"]
            and checks["weights_match"]
        )
        detail = (
            f"writer killed mid-save (rc {proc.returncode}); previous checkpoint unchanged={checks['file_unchanged']}, "
            f"loads={checks['loads']}, weights match={checks['weights_match']}"
        )
        return ScenarioResult("killed_while_saving", bool(passed), detail, 0.0, checks)

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)  # the child needs the environment passed to it
        env["GENESIS_FP16_STATE_DIR"] = str(self.state_dir)
        env["GENESIS_FP16_PROFILES_FILE"] = str(self.settings.effective_profiles_file)
        env["ENABLE_FP16_TRAINING"] = "true"
        env["GENESIS_FP16_LOG_LEVEL"] = "WARNING"
        return env

    def rollback_survives_restart(self) -> ScenarioResult:
        """A new process resolves a rolled-back agent to FP32 from the ledger alone."""
        agent = "drill_restart"
        self.ledger.enable(agent, actor="drill", reason="drill: restart")
        self.ledger.rollback(agent, "drill: rolled back before a restart", actor="drill", severity="P1")
        code = (
            "import json\n"
            "from genesis_fp16.rollout.policy import resolve_policy\n"
            f"p = resolve_policy({agent!r}, precision={REDUCED!r})\n"
            "print(json.dumps({'stage': p.stage, 'precision': p.precision, 'source': p.sources['enabled']}))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=self._child_env()
        )
        try:
            seen = json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            seen = {"error": out.stderr.strip()[-500:]}
        passed = (
            seen.get("stage") == "rolled_back"
            and seen.get("precision") == "fp32"
            and seen.get("source") == "ledger:rolled_back"
        )
        detail = (
            f"new process (pid != {os.getpid()}) sees stage {seen.get('stage')}, precision {seen.get('precision')} "
            f"from {seen.get('source')}"
        )
        return ScenarioResult(
            "rollback_survives_restart", bool(passed), detail, 0.0, {"child": seen, "returncode": out.returncode}
        )

    def kill_switch(self) -> ScenarioResult:
        """ENABLE_FP16_TRAINING=false wins over a ledger stage of on and an explicit precision."""
        agent = "drill_kill_switch"
        self.ledger.enable(agent, actor="drill", reason="drill: kill switch")
        off = self.settings.model_copy(update={"enable_fp16_training": False})
        switched = resolve_trainer(agent, *model_and_optimizer(), settings=off, precision=REDUCED)
        on = self._trainer(agent, *model_and_optimizer())
        checks = {
            "with_switch": switched.trainer.precision.name,
            "source": switched.policy.sources["enabled"],
            "without_switch": on.precision.name,
        }
        passed = (
            checks["with_switch"] == "fp32"
            and "kill switch" in checks["source"]
            and checks["without_switch"] == REDUCED
        )
        detail = (
            f"stage on + precision={REDUCED}: kill switch -> {checks['with_switch']}; without it -> "
            f"{checks['without_switch']}"
        )
        return ScenarioResult("kill_switch", bool(passed), detail, 0.0, checks)

    def silent_degradation(self) -> ScenarioResult:
        """Stage on: a quietly worse reduced-precision path is caught by the FP32 canary (drill/canary.py)."""
        return canary.silent_degradation(self)

    def healthy_control(self) -> ScenarioResult:
        """Stage on: a healthy model through 50 canaries, no rollback (drill/canary.py)."""
        return canary.healthy_control(self)

    def events_recorded(self) -> ScenarioResult:
        """Every rollback above is a structured event in the scratch event log."""
        events = telemetry.read_events(self.settings.events_path)
        names = {e.get("event") for e in events}
        rollbacks = [e for e in events if e.get("event") == "guard.rollback"]
        needed = {
            "guard.decision",
            "guard.rollback",
            "rollout.stage_changed",
            "trainer.nonfinite_streak",
            "guard.recommendation",
            "guard.canary",
        }
        checks = {"events": len(events), "missing": sorted(needed - names), "guard_rollbacks": len(rollbacks)}
        passed = not checks["missing"] and len(rollbacks) >= 3
        detail = f"{len(events)} events in {self.settings.events_path.name}; missing: {checks['missing'] or 'none'}"
        return ScenarioResult("events_recorded", bool(passed), detail, 0.0, checks)

    def scenarios(self) -> list[tuple[str, Callable[[], ScenarioResult]]]:
        return [
            ("nan_storm", self.nan_storm),
            ("overflow_storm", self.overflow_storm),
            ("overflow_warning", self.overflow_warning),
            ("killed_while_saving", self.killed_while_saving),
            ("rollback_survives_restart", self.rollback_survives_restart),
            ("kill_switch", self.kill_switch),
            ("silent_degradation", self.silent_degradation),
            ("healthy_control", self.healthy_control),
            ("events_recorded", self.events_recorded),
        ]


def run_drill(
    state_dir: Union[str, Path, None] = None,
    *,
    keep: bool = False,
    progress: Optional[Callable[[str, Optional[ScenarioResult]], None]] = None,
) -> dict[str, Any]:
    """Run every scenario; returns ``{"passed": bool, "scenarios": [...], ...}``.
    Without ``state_dir`` a temporary one is made and removed afterwards unless ``keep``."""
    started = time.perf_counter()
    own = state_dir is None
    scratch = Path(tempfile.mkdtemp(prefix="genesis-fp16-drill-")) if own else Path(state_dir)
    scratch.mkdir(parents=True, exist_ok=True)
    drill = Drill(scratch)  # the drill's events go to the scratch dir
    results: list[ScenarioResult] = []
    threads = torch.get_num_threads()
    # the scenarios' tensors are tiny: one intra-op thread runs them fastest, and
    # on a loaded machine many times faster than several threads contending
    torch.set_num_threads(1)
    try:
        for name, fn in drill.scenarios():
            if progress:
                progress(name, None)
            t0 = time.perf_counter()
            try:
                result = fn()
            except Exception as exc:  # a crashing scenario is a failed scenario, reported as such
                result = ScenarioResult(name, False, f"raised {type(exc).__name__}: {exc}", 0.0)
            result.seconds = round(time.perf_counter() - t0, 3)
            results.append(result)
            if progress:
                progress(name, result)
    finally:
        torch.set_num_threads(threads)
        # back to the real event log, also when nothing had configured logging
        # before (the scratch dir is removed below)
        telemetry.configure_logging(force=True)
    report = {
        "passed": all(r.passed for r in results),
        "scenarios": [asdict(r) for r in results],
        "seconds": round(time.perf_counter() - started, 3),
        "state_dir": str(scratch) if (keep or not own) else None,
        "torch_version": torch.__version__,
        "reduced_precision": REDUCED,
    }
    telemetry.get_logger("genesis_fp16.rollout.drill").info(
        "drill.finished",
        passed=report["passed"],
        failed=[r.name for r in results if not r.passed],
        seconds=report["seconds"],
    )
    if own and not keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return report
