"""Docstrings as the API reference renders them: mkdocstrings reads Markdown,
so a Sphinx role (`:class:`...``) shows up literally; a name without a
docstring is left out of the reference, so every name the README and the
Python guides use has one."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from agents.evolve_config import EvolveConfig

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("genesis_fp16", "infrastructure", "agents")
SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|attr|mod|exc|obj|const|ref):`")

# What README.md, docs/PYTHON_API.md and docs/EMBEDDING.md call or read.
GUIDE_NAMES = [
    "genesis_fp16.training.trainer.FP16Trainer",
    "genesis_fp16.training.config.FP16TrainingConfig",
    "genesis_fp16.training.trainer.FP16Trainer.training_step",
    "genesis_fp16.training.trainer.FP16Trainer.backward_and_step",
    "genesis_fp16.training.trainer.FP16Trainer.get_stats",
    "genesis_fp16.training.trainer.FP16Trainer.save_checkpoint",
    "genesis_fp16.training.trainer.FP16Trainer.train_batches",
    "genesis_fp16.training.registry.trainer_for",
    "genesis_fp16.training.registry.create_trainer",
    "genesis_fp16.rollout.policy.EffectivePolicy",
    "genesis_fp16.rollout.policy.EffectivePolicy.precision",
    "genesis_fp16.rollout.policy.EffectivePolicy.running",
    "genesis_fp16.rollout.policy.EffectivePolicy.sources",
    "genesis_fp16.rollout.ledger.RolloutLedger",
    "genesis_fp16.rollout.ledger.RolloutLedger.from_settings",
    "genesis_fp16.rollout.ledger.RolloutLedger.enable",
    "genesis_fp16.rollout.ledger.RolloutLedger.stage",
    "genesis_fp16.rollout.ledger.RolloutLedger.history",
    "genesis_fp16.training.guarded.GuardedTraining",
    "genesis_fp16.training.guarded.GuardedTraining.train",
    "genesis_fp16.training.guarded.GuardedTraining.check",
    "genesis_fp16.training.guarded.GuardedTraining.trainer",
    "genesis_fp16.training.guarded.GuardedTraining.rollbacks",
    "genesis_fp16.rollout.guard.GuardDecision",
    "genesis_fp16.rollout.guard.GuardDecision.severity",
    "genesis_fp16.rollout.guard.GuardDecision.action",
    "genesis_fp16.rollout.guard.GuardDecision.reason",
    "genesis_fp16.rollout.guard.GuardDecision.metrics",
    "genesis_fp16.rollout.guard.RollbackGuard",
    "genesis_fp16.base.settings.load_settings",
    "genesis_fp16.base.settings.Settings.events_path",
    "genesis_fp16.base.telemetry.read_events",
    "infrastructure.world_model.WorldModel",
    "infrastructure.world_model.WorldModel.train",
    "infrastructure.world_model.WorldModel.predict",
    "infrastructure.world_model.WorldModel.predict_sync",
    "infrastructure.world_model.WorldModel.rollouts",
    "infrastructure.world_model.WorldModel.model_env",
    "infrastructure.model_env.ModelEnv",
    "infrastructure.model_env.ModelEnv.reset",
    "infrastructure.model_env.ModelEnv.step",
    "infrastructure.model_env.branched_rollouts",
    "infrastructure.model_env.Rollouts",
    "infrastructure.model_env.RolloutStats",
    "infrastructure.world_model.WorldModel.save",
    "infrastructure.world_model.WorldModel.load",
    "infrastructure.world_model.WorldModel.checkpoint_path",
    "infrastructure.world_model.WorldModel.precision",
    "infrastructure.dynamics.NotTrainedError",
    "infrastructure.dynamics.NonFiniteDataError",
    "infrastructure.world_model.TrainReport",
    "infrastructure.replay_buffer.ReplayBuffer",
    "infrastructure.replay_buffer.ReplayBuffer.append_generation",
    "infrastructure.replay_buffer.ReplayBuffer.sample",
    "infrastructure.replay_buffer.ReplayBuffer.delete_trajectories",
    "infrastructure.trajectory.Trajectory",
    "agents.tasks.task.Task",
    "agents.tasks.task.Task.resolve",
    "agents.tasks.task.ExactStates",
    "agents.evolve_config.EvolveConfig",
    "agents.se_darwin_agent.SEDarwinAgent",
    "agents.se_darwin_agent.SEDarwinAgent.evolve",
    "agents.se_darwin_agent.SEDarwinAgent.resume",
    "agents.se_darwin_agent.run_cma_baseline",
    "agents.policies.load_policy",
    "agents.policies.EvolvedPolicy",
    "agents.policies.EvolvedPolicy.predict",
    "agents.policies.EvolvedPolicy.module",
    "agents.policies.EvolvedPolicy.evaluate",
    "agents.policies.EvolvedPolicy.save",
    "agents.policies.PolicyEvaluation",
    "agents.cma_search.CMASearch",
    "agents.cma_search.CMASearch.ask",
    "infrastructure.critic.Critic",
    "infrastructure.critic.Critic.train",
    "infrastructure.critic.Critic.value",
]


def _docstrings(path: Path) -> list[tuple[int, str]]:
    """Every string statement: module, class and function docstrings and the
    attribute docstrings under fields, which mkdocstrings renders too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.lineno, node.value.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]


def test_sphinx_role_is_detected() -> None:
    assert SPHINX_ROLE.search("see :class:`Guard` and") and SPHINX_ROLE.search(":py:meth:`x`")
    assert not SPHINX_ROLE.search("see `Guard`, a [Guard][genesis_fp16.rollout.guard.RollbackGuard]")


def test_no_sphinx_roles_in_docstrings() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        for line, text in _docstrings(path)
        if SPHINX_ROLE.search(text)
    ]
    assert not found, (
        f"Sphinx roles render literally in the API reference (Markdown): use `Name` or [Name][module.Name]: {found}"
    )


@pytest.fixture(scope="module")
def loaded() -> dict[str, object]:
    griffe = pytest.importorskip(
        "griffe", reason="the docs extra is not installed: pip install -e '.[docs]' (dev includes it)"
    )
    loader = griffe.GriffeLoader(search_paths=[str(REPO)])
    return {name: loader.load(name) for name in PACKAGES}


def _lookup(loaded: dict[str, object], dotted: str):  # type: ignore[no-untyped-def]
    package, _, rest = dotted.partition(".")
    obj = loaded[package][rest]  # type: ignore[index]
    return obj.final_target if obj.is_alias else obj


def test_names_the_guides_use_have_docstrings(loaded) -> None:
    missing = [name for name in GUIDE_NAMES if not _lookup(loaded, name).docstring]
    assert not missing, f"the API reference leaves these out (no docstring): {missing}"


def test_every_evolve_config_field_has_a_docstring(loaded) -> None:
    cls = _lookup(loaded, "agents.evolve_config.EvolveConfig")
    undocumented = [f.name for f in fields(EvolveConfig) if not cls.members[f.name].docstring]
    assert not undocumented, f"EvolveConfig fields without a docstring: {undocumented}"
    assert "::: agents.evolve_config.EvolveConfig" in (REPO / "docs" / "reference" / "agents.md").read_text(
        encoding="utf-8"
    )
