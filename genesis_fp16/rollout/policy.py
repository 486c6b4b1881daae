"""An agent's effective precision policy.

Layers, lowest first: global settings < the agent's profile < an explicit
argument; then the rollout ledger (a rolled-back or ``off`` agent trains in
FP32; ``shadow`` or ``on`` switches reduced precision on unless an explicit
argument says ``enabled=False``) and, over everything, the kill switch
``ENABLE_FP16_TRAINING=false``.
The precision fields of the layers are merged as one dict and validated once
as a `PrecisionConfig`. Each value records where it came from: in words for
``genesis-fp16 profiles show`` (``sources``) and typed (``origins``). What
comes out for the decision is one `PrecisionRequest` (``precision``): the mode
and where it came from, how a mode the device cannot run is met, whether
``auto`` may be measured, and who switched reduced precision off and why; the
decision (`genesis_fp16.precision.decision.decide`) reads nothing else.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from genesis_fp16.base.settings import AutoPrecision, Settings, load_settings
from genesis_fp16.precision.request import PrecisionRequest, Source
from genesis_fp16.training.config import PRECISION_FIELDS, FP16TrainingConfig, validate_precision


@dataclass
class EffectivePolicy:
    """What ``agent`` asked for (``precision``, ``config``) and, once
    ``registry.resolve_trainer`` built a trainer from it, what runs (``running``:
    ``auto`` resolved for the device, or a fallback)."""

    agent: str
    """The agent the policy was resolved for."""
    precision: PrecisionRequest
    """The effective request, all layers, the ledger and the kill switch together: what the decision takes.
    Its text is the precision asked for (``auto`` stays ``auto``; ``fp32`` when reduced precision is off)."""
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
    def shadow(self) -> bool:
        """Stage ``shadow``: measure an FP32 reference beside the reduced-precision run."""
        return self.stage == "shadow" and self.config.enabled

    def origin(self, key: str) -> Source:
        """Where the value of ``key`` came from (`Source.SETTINGS` when no layer above the settings set it)."""
        return self.origins.get(key, Source.SETTINGS)

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain data (copies): ``precision`` is what runs once a trainer was built (else what was
        asked for), ``requested`` what was asked for, and ``shadow``."""
        return {
            "agent": self.agent,
            **asdict(self),
            "precision": self.running or str(self.precision),
            "requested": str(self.precision),
            "stage": self.stage,
            "shadow": self.shadow,
            "origins": {key: source.value for key, source in self.origins.items()},
        }


def resolve_policy(
    agent: str,
    settings: Optional[Settings] = None,
    *,
    precision: Optional[PrecisionRequest] = None,
    overrides: Optional[dict[str, Any]] = None,
) -> EffectivePolicy:
    """The policy ``agent`` trains under now. ``precision`` (a request, or its text) and ``overrides`` are
    explicit arguments (the highest layer, below the ledger and the kill switch)."""
    settings = settings or load_settings()
    explicit = dict(overrides or {})
    if precision is not None:
        try:
            explicit["precision"] = PrecisionRequest.parse(precision).mode.value
        except ValueError as exc:
            raise ValueError(f"agent {agent!r}: {exc}") from None
        if explicit["precision"] != "fp32":
            explicit.setdefault("enabled", True)
    allowed = [f.name for f in fields(FP16TrainingConfig)]  # its init-only loss_scale is no option
    unknown = sorted(set(explicit) - set(allowed))
    if unknown:
        raise ValueError(
            f"agent {agent!r}: unknown trainer option(s) {', '.join(unknown)} in overrides; allowed are "
            f"{', '.join(allowed)}"
        )

    from genesis_fp16.rollout import profiles as _profiles  # layered per-agent profile (may be empty)

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
    update = {key: value for key, value in layered.items() if key in PRECISION_FIELDS}
    values = {key: value for key, value in layered.items() if key not in PRECISION_FIELDS}
    try:
        merged = validate_precision({**settings.precision_config.model_dump(), **update})
    except ValueError as exc:
        origin = ", ".join(f"{k} from {v}" for k, v in sources.items() if v != "settings")
        raise ValueError(f"agent {agent!r}: {exc}" + (f" (non-default layers: {origin})" if origin else "")) from None

    reason = "settings and profile"
    from genesis_fp16.rollout import ledger as _rollout  # the persistent ledger

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
    request = PrecisionRequest(
        merged.precision,
        origins.get("precision", Source.SETTINGS),
        merged.on_unsupported,
        measure=settings.auto_precision == AutoPrecision.MEASURE,
    )
    if not values["enabled"]:
        off = origins.get("enabled", Source.SETTINGS)
        request = request.switched_off(off, reason if reason != "settings and profile" else "enabled=False")
        sources["precision"] = sources["enabled"]
        origins["precision"] = off
    config = FP16TrainingConfig.from_precision_config(merged, **values)
    return EffectivePolicy(
        agent=agent,
        precision=request,
        config=config,
        sources=sources,
        origins=origins,
        stage=stage,
        thresholds=thresholds,
        reason=reason,
    )
