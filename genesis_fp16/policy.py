"""An agent's effective precision policy.

Layers, lowest first: global settings < the agent's profile < an explicit
argument; then the rollout ledger (a rolled-back or ``off`` agent trains in
FP32; ``shadow`` or ``on`` switches reduced precision on unless an explicit
argument says ``enabled=False``) and, over everything, the kill switch
``ENABLE_FP16_TRAINING=false``.
The precision fields of the layers are merged as one dict and validated once
as a `PrecisionConfig`. Each value records
where it came from: in words for ``genesis-fp16 profiles show``
(``sources``) and as a typed `Source` (``origins``), which
`genesis_fp16.decision` reads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from .config import PRECISION_FIELDS, FP16TrainingConfig, precision_name, validate_precision
from .modes import Source
from .settings import Settings, load_settings

@dataclass
class EffectivePolicy:
    """What ``agent`` asked for (``config``, ``requested``) and, once
    ``registry.trainer_for`` built a trainer from it, what runs (``running``:
    ``auto`` resolved for the device, or a fallback)."""

    agent: str
    """The agent the policy was resolved for."""
    config: FP16TrainingConfig
    """The trainer configuration all layers together give."""
    sources: dict[str, str] = field(default_factory=dict)
    """Which layer set each value: field name -> `settings`, `profile:<where>`, `argument`,
    `ledger:<stage>` or the kill switch."""
    origins: dict[str, Source] = field(default_factory=dict)
    """The same per field, typed (`Source.SETTINGS`, ``PROFILE``, ``EXPLICIT``, ``LEDGER``,
    ``KILL_SWITCH``): what a precision decision says it came from. A field not in it came from the settings."""
    stage: Optional[str] = None
    """The agent's rollout stage (`off`, `shadow`, `on`, `rolled_back`); None when the ledger has never seen it."""
    thresholds: dict[str, Any] = field(default_factory=dict)
    """The rollback guard's thresholds for this agent (defaults, then its profile)."""
    reason: str = ""
    """Why the precision is what it is, in words (e.g. a rollback or the kill switch)."""
    running: Optional[str] = None
    """The precision that runs, once a trainer was built; None before."""

    @property
    def requested(self) -> str:
        """The precision asked for (``auto`` stays ``auto``); ``fp32`` when reduced precision is off."""
        return self.config.requested_precision.value

    @property
    def precision(self) -> str:
        """The precision that runs when a trainer was built from this policy
        (``running``), else the one asked for (``requested``)."""
        return self.running or self.requested

    @property
    def shadow(self) -> bool:
        """Stage ``shadow``: measure an FP32 reference beside the reduced-precision run."""
        return self.stage == "shadow" and self.config.enabled

    def origin(self, key: str) -> Source:
        """Where the value of ``key`` came from (`Source.SETTINGS` when no layer above the settings set it)."""
        return self.origins.get(key, Source.SETTINGS)

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain data (copies), with the derived ``precision``, ``requested`` and ``shadow``."""
        return {
            "agent": self.agent, "precision": self.precision, "requested": self.requested, "stage": self.stage,
            "shadow": self.shadow, **asdict(self), "origins": {key: source.value for key, source in self.origins.items()},
        }


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
    explicit = dict(overrides or {})
    if precision is not None:
        explicit["precision"] = precision
        if precision != "fp32":
            explicit.setdefault("enabled", True)
    allowed = [f.name for f in fields(FP16TrainingConfig)]
    unknown = sorted(set(explicit) - set(allowed))
    if unknown:
        raise ValueError(
            f"agent {agent!r}: unknown trainer option(s) {', '.join(unknown)} in overrides; allowed are {', '.join(allowed)}"
        )

    from . import profiles as _profiles  # layered per-agent profile (may be empty)

    profile = _profiles.profile_layer(agent, settings)
    thresholds = {**_profiles.THRESHOLD_DEFAULTS, **profile["thresholds"]}
    sources = {key: "settings" for key in ("enabled", *PRECISION_FIELDS)}
    sources.update({key: f"profile:{origin}" for key, origin in profile["sources"].items()})
    sources.update({key: "argument" for key in explicit})
    origins = {key: Source.PROFILE for key in profile["sources"]}
    origins.update({key: Source.EXPLICIT for key in explicit})

    # trainer-config names, lowest layer first; the precision fields are merged
    # and validated as one PrecisionConfig, the rest (enabled, device, ...) taken as they are
    layered = {"enabled": settings.enable_fp16_training, **profile["trainer"], **explicit}
    update = {precision_name(key): value for key, value in layered.items() if key in PRECISION_FIELDS}
    values = {key: value for key, value in layered.items() if key not in PRECISION_FIELDS}
    try:
        merged = validate_precision({**settings.precision_config.model_dump(), **update})
    except ValueError as exc:
        origin = ", ".join(f"{k} from {v}" for k, v in sources.items() if v != "settings")
        raise ValueError(f"agent {agent!r}: {exc}" + (f" (non-default layers: {origin})" if origin else "")) from None

    reason = "settings and profile"
    from . import rollout as _rollout  # the persistent ledger

    stage = _rollout.current_stage(agent, settings)
    if stage in ("off", "rolled_back"):
        values["enabled"] = False
        sources["enabled"] = f"ledger:{stage}"
        origins["enabled"] = Source.LEDGER
        reason = f"rollout ledger stage is {stage}"
    elif stage in ("shadow", "on") and explicit.get("enabled", True):
        # an operator rolled this agent out: reduced precision is on unless an
        # explicit argument switched it off
        if not values["enabled"]:
            values["enabled"] = True
            sources["enabled"] = f"ledger:{stage}"
            origins["enabled"] = Source.LEDGER
        reason = f"rollout ledger stage is {stage}"
    if not settings.enable_fp16_training:
        values["enabled"] = False
        sources["enabled"] = "kill switch (ENABLE_FP16_TRAINING=false)"
        origins["enabled"] = Source.KILL_SWITCH
        reason = "kill switch ENABLE_FP16_TRAINING=false"
    if not values["enabled"]:
        sources["precision"] = sources["enabled"]
        origins["precision"] = origins.get("enabled", Source.SETTINGS)
    config = FP16TrainingConfig.from_precision_config(merged, **values)
    return EffectivePolicy(agent=agent, config=config, sources=sources, origins=origins, stage=stage, thresholds=thresholds,
                           reason=reason)
