"""An agent's effective precision policy.

Layers, lowest first: global settings < the agent's profile < an explicit
argument; then the rollout ledger (a rolled-back or ``off`` agent trains in
FP32; ``shadow`` or ``on`` switches reduced precision on unless an explicit
argument says ``enabled=False``) and, over everything, the kill switch
``ENABLE_FP16_TRAINING=false``.
Each value records where it came from, for ``genesis-fp16 profiles show``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from .settings import Settings, load_settings
from .trainer import FP16TrainingConfig

# trainer-config field <- settings field
_SETTINGS_FIELDS = {
    "enabled": "enable_fp16_training",
    "precision": "precision",
    "loss_scale": "init_scale",
    "growth_factor": "growth_factor",
    "backoff_factor": "backoff_factor",
    "growth_interval": "growth_interval",
    "max_grad_norm": "max_grad_norm",
    "grad_accumulation_steps": "grad_accumulation_steps",
    "on_unsupported": "on_unsupported",
    "nonfinite_streak_threshold": "nonfinite_streak_threshold",
}


@dataclass
class EffectivePolicy:
    agent: str
    config: FP16TrainingConfig
    sources: dict[str, str] = field(default_factory=dict)
    stage: Optional[str] = None
    thresholds: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    @property
    def precision(self) -> str:
        return self.config.requested_precision.value

    @property
    def shadow(self) -> bool:
        """Stage ``shadow``: measure an FP32 reference beside the reduced-precision run."""
        return self.stage == "shadow" and self.config.enabled

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "agent": self.agent,
            "precision": self.precision,
            "stage": self.stage,
            "shadow": self.shadow,
            "reason": self.reason,
            "config": asdict(self.config),
            "sources": dict(self.sources),
            "thresholds": dict(self.thresholds),
        }


def _settings_values(settings: Settings) -> dict[str, Any]:
    values = {}
    for cfg_key, settings_key in _SETTINGS_FIELDS.items():
        value = getattr(settings, settings_key)
        values[cfg_key] = getattr(value, "value", value)
    return values


def resolve_policy(
    agent: str,
    settings: Optional[Settings] = None,
    *,
    precision: Optional[str] = None,
    overrides: Optional[dict[str, Any]] = None,
) -> EffectivePolicy:
    """The policy ``agent`` trains under now. ``precision`` and ``overrides``
    are explicit arguments (highest layer below ledger and kill switch)."""
    settings = settings or load_settings()
    values = _settings_values(settings)
    sources = {key: "settings" for key in values}
    thresholds: dict[str, Any] = {}

    from . import profiles as _profiles  # layered per-agent profile (may be empty)

    profile = _profiles.profile_layer(agent, settings)
    profile_sources = profile.get("sources", {})
    for key, value in profile.get("trainer", {}).items():
        values[key] = value
        sources[key] = f"profile:{profile_sources.get(key, profile.get('source', 'profiles'))}"
    thresholds.update(_profiles.THRESHOLD_DEFAULTS)
    thresholds.update(profile.get("thresholds", {}))

    explicit = dict(overrides or {})
    if precision is not None:
        explicit["precision"] = precision
        if precision != "fp32":
            explicit.setdefault("enabled", True)
    for key, value in explicit.items():
        values[key] = value
        sources[key] = "argument"

    stage = None
    reason = "settings and profile"
    from . import rollout as _rollout  # the persistent ledger

    stage = _rollout.current_stage(agent, settings)
    if stage in ("off", "rolled_back"):
        values["enabled"] = False
        sources["enabled"] = f"ledger:{stage}"
        reason = f"rollout ledger stage is {stage}"
    elif stage in ("shadow", "on") and explicit.get("enabled", True):
        # an operator rolled this agent out: reduced precision is on unless an
        # explicit argument switched it off
        if not values["enabled"]:
            values["enabled"] = True
            sources["enabled"] = f"ledger:{stage}"
        reason = f"rollout ledger stage is {stage}"
    if not settings.enable_fp16_training:
        values["enabled"] = False
        sources["enabled"] = "kill switch (ENABLE_FP16_TRAINING=false)"
        reason = "kill switch ENABLE_FP16_TRAINING=false"
    if not values["enabled"]:
        sources["precision"] = sources["enabled"]
    unknown = sorted(set(values) - {f.name for f in fields(FP16TrainingConfig)})
    if unknown:
        allowed = ", ".join(f.name for f in fields(FP16TrainingConfig))
        raise ValueError(f"agent {agent!r}: unknown trainer option(s) {', '.join(unknown)} in overrides; allowed are {allowed}")
    try:
        config = FP16TrainingConfig(**values)
    except ValueError as exc:
        origin = ", ".join(f"{k} from {v}" for k, v in sources.items() if v != "settings")
        raise ValueError(f"agent {agent!r}: {exc}" + (f" (non-default layers: {origin})" if origin else "")) from None
    return EffectivePolicy(agent=agent, config=config, sources=sources, stage=stage, thresholds=thresholds, reason=reason)
