"""Trainer registry: names map to factories.

Built-in names: ``fp32``, ``fp16``, ``bf16`` (force that precision),
``auto`` (use the config's precision), and ``ddp`` / ``fsdp`` (under
torchrun), which name their factories as ``"module:attr"`` and import them on
first use: the registry never imports ``genesis_fp16.distributed``. Other
packages register through the entry-point group ``genesis_fp16.trainers``; an
entry point names a callable
``factory(model, optimizer, config, scheduler, **kwargs) -> FP16Trainer``.
"""

from __future__ import annotations

import dataclasses
import pkgutil
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, Callable, Optional

from genesis_fp16.base.settings import DistributedWrap, PrecisionMode, Settings, load_settings
from genesis_fp16.base.telemetry import get_logger

if TYPE_CHECKING:  # imported where used: `genesis-fp16 trainers` lists this registry and must not import torch
    import torch

    from genesis_fp16.precision.decision import PrecisionDecision
    from genesis_fp16.precision.request import PrecisionRequest
    from genesis_fp16.rollout.policy import EffectivePolicy
    from genesis_fp16.training.trainer import FP16Trainer, FP16TrainingConfig

ENTRY_POINT_GROUP = "genesis_fp16.trainers"

TrainerFactory = Callable[..., "FP16Trainer"]


@dataclass(frozen=True)
class TrainerSpec:
    name: str
    factory: TrainerFactory
    description: str
    source: str = "builtin"


_REGISTRY: dict[str, TrainerSpec] = {}
_LOCK = threading.Lock()
_LOAD_LOCK = threading.RLock()  # one thread loads the plugins; the others wait for it
_ENTRY_POINTS_LOADED = False
_LOADING = False  # a plugin that looks the registry up while it is imported sees what is there


class UnknownTrainerError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


def register(
    name: str, factory: TrainerFactory, description: str = "", *, source: str = "builtin", replace: bool = False
) -> None:
    with _LOCK:
        if name in _REGISTRY and not replace:
            raise ValueError(f"trainer {name!r} is already registered (by {_REGISTRY[name].source})")
        _REGISTRY[name] = TrainerSpec(name, factory, description, source)


@dataclass(frozen=True)
class LazyFactory:
    """A factory named ``"module:attr"``, imported when first called, so that
    listing the trainers imports neither the module nor ``torch.distributed``."""

    target: str

    def resolve(self) -> TrainerFactory:
        try:
            return pkgutil.resolve_name(self.target)
        except (ImportError, AttributeError) as exc:
            raise ImportError(
                f"trainer factory {self.target} could not be loaded ({exc}); "
                "check that its module and that module's dependencies (e.g. torch.distributed) are installed"
            ) from exc

    def __call__(self, *args: Any, **kwargs: Any) -> FP16Trainer:
        return self.resolve()(*args, **kwargs)


def _precision_factory(precision: str) -> TrainerFactory:
    def factory(
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: Optional[FP16TrainingConfig] = None,
        scheduler: Any = None,
        **kwargs: Any,
    ) -> FP16Trainer:
        from genesis_fp16.training.trainer import FP16Trainer, FP16TrainingConfig

        base = config or FP16TrainingConfig()
        forced = dataclasses.replace(base, precision=precision, enabled=precision != "fp32" or base.enabled)
        return FP16Trainer(model, optimizer, forced, scheduler, **kwargs)

    return factory


def _auto_factory(model, optimizer, config=None, scheduler=None, **kwargs) -> FP16Trainer:
    from genesis_fp16.training.trainer import FP16Trainer

    return FP16Trainer(model, optimizer, config, scheduler, **kwargs)


register("auto", _auto_factory, "single process; precision from the config (auto picks per device)")
register("fp32", _precision_factory("fp32"), "single process, FP32 (disabled scaler, no autocast)")
register("fp16", _precision_factory("fp16"), "single process, FP16 autocast + GradScaler")
register("bf16", _precision_factory("bf16"), "single process, BF16 autocast, no scaler")
register(
    "ddp",
    LazyFactory("genesis_fp16.distributed.ddp:DDPTrainer.create"),
    "DDP under torchrun; precision from the config (fp16: GradScaler)",
)
register(
    "fsdp",
    LazyFactory("genesis_fp16.distributed.fsdp:FSDPTrainer.create"),
    "FSDP2 fully_shard under torchrun; fp16 uses ShardedGradScaler; DCP checkpoints",
)


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED, _LOADING
    if _ENTRY_POINTS_LOADED:
        return
    with _LOAD_LOCK:
        if _ENTRY_POINTS_LOADED or _LOADING:
            return
        _LOADING = True
        try:
            log = get_logger("genesis_fp16.training.registry")
            for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                if ep.name in _REGISTRY:
                    continue
                try:
                    factory = ep.load()
                except Exception as exc:  # a broken plugin must not hide the built-ins
                    log.error("registry.plugin_failed", name=ep.name, entry_point=ep.value, error=str(exc))
                    continue
                register(ep.name, factory, getattr(factory, "__doc__", "") or "", source=f"entry point {ep.value}")
        finally:
            _LOADING = False
        _ENTRY_POINTS_LOADED = True


def available() -> dict[str, TrainerSpec]:
    _load_entry_points()
    with _LOCK:
        return dict(sorted(_REGISTRY.items()))


def get(name: str) -> TrainerSpec:
    specs = available()
    if name not in specs:
        raise UnknownTrainerError(f"unknown trainer {name!r}: registered trainers are {', '.join(specs)}")
    return specs[name]


def create_trainer(
    registry_name: str,
    /,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Optional[FP16TrainingConfig] = None,
    scheduler: Any = None,
    **kwargs: Any,
) -> FP16Trainer:
    """A trainer from the registry entry `registry_name` (`fp32`, `fp16`,
    `bf16`, `ddp`, `fsdp`, or a plugin's; `genesis-fp16 trainers` lists them),
    with no settings, profile or ledger applied: `trainer_for` is the
    per-agent path. Raises `UnknownTrainerError` naming the registered ones."""
    return get(registry_name).factory(model, optimizer, config, scheduler, **kwargs)


@dataclass(frozen=True)
class ResolvedTrainer:
    """A trainer built for an agent, the policy it was built from and its precision decision."""

    trainer: FP16Trainer
    """The trainer, built by the registry entry the settings name (``auto``, ``ddp``, ``fsdp``)."""
    policy: EffectivePolicy
    """What settings, profile, explicit arguments, ledger and kill switch resolved to; ``running`` is what runs."""
    decision: PrecisionDecision
    """What the trainer trains in, where that came from and why (`genesis_fp16.precision.decision`)."""


Sample = tuple[Any, Callable[..., Any]]
"""``(batch, loss_fn)``: a batch of the workload and its loss, for a measured ``auto``."""


def decide_for(
    agent: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    policy: EffectivePolicy,
    settings: Settings,
    *,
    sample: Optional[Sample] = None,
    measures: bool = True,
) -> PrecisionDecision:
    """The precision decision for ``agent``'s trainer, before it is built: the
    policy's request (``policy.precision``) decided by
    `genesis_fp16.precision.decision.decide`, on a measurement when it asks
    for ``auto`` and may measure, the trainer class may measure (``measures``)
    and a ``sample`` batch is given (`measure.measured_auto`: the host cache,
    else a measurement on copies); a named precision looks the host cache up
    only (a measurement says whether it is slow here); else the flag rule."""
    import torch

    from genesis_fp16.precision import measure
    from genesis_fp16.precision.decision import decide
    from genesis_fp16.training.trainer import calibration_copies

    precision = policy.precision
    device = (
        torch.device(policy.config.device)
        if policy.config.device
        else next((p.device for p in model.parameters()), torch.device("cpu"))
    )
    measured, cached, why = None, False, ""
    if precision.requested == PrecisionMode.AUTO and precision.measure:
        if not measures:
            why = "the distributed trainers keep the flag rule, so that every rank decides alike"
        elif sample is None:
            why = "no sample batch was given to measure on"
        else:
            found = measure.measured_auto(
                model,
                optimizer,
                sample[0],
                sample[1],
                device=device,
                settings=settings,
                copy_trainer=calibration_copies(policy.config, device, agent),
            )
            measured, cached, why = found.calibration, found.cached, found.why
    elif precision.requested not in (PrecisionMode.AUTO, PrecisionMode.FP32) and sample is not None:
        measured = measure.cached_calibration(model, optimizer, sample[0], device, settings)
    return decide(precision, device, measured=measured, cached=cached, unmeasured=why)


def resolve_trainer(
    agent: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    scheduler: Any = None,
    settings: Optional[Settings] = None,
    precision: Optional[PrecisionRequest] = None,
    overrides: Optional[dict[str, Any]] = None,
    sample: Optional[Sample] = None,
    decision: Optional[PrecisionDecision] = None,
    **kwargs: Any,
) -> ResolvedTrainer:
    """The trainer ``agent`` should use now, its `EffectivePolicy` and its
    `PrecisionDecision`: global settings, then its profile, then explicit
    arguments, then the rollout ledger and the kill switch, decided once
    (`decide_for`; ``sample`` lets ``auto`` measure; a ``decision`` made
    earlier for the same policy is reused) before the trainer is built."""
    from genesis_fp16.rollout.policy import resolve_policy

    settings = settings or load_settings()
    policy = resolve_policy(agent, settings, precision=precision, overrides=overrides)
    name = "auto" if settings.distributed == DistributedWrap.NONE else settings.distributed.value
    kwargs.setdefault("name", agent)
    spec = get(name)
    measures = name == "auto" and spec.source == "builtin"
    if decision is None or decision.requested != policy.precision.requested:
        decision = decide_for(agent, model, optimizer, policy, settings, sample=sample, measures=measures)
    config = policy.config
    if spec.source == "builtin":
        kwargs["decision"] = decision
    else:  # a plugin's factory gets the decided mode by name
        config = dataclasses.replace(config, precision=decision.mode.value, enabled=decision.mode != PrecisionMode.FP32)
    trainer = create_trainer(name, model, optimizer, config, scheduler, **kwargs)
    policy.running = trainer.precision.name
    get_logger("genesis_fp16.training.registry").debug(
        "registry.trainer_resolved", agent=agent, trainer=name, precision=policy.running, reason=decision.line()
    )
    return ResolvedTrainer(trainer, policy, decision)


def trainer_for(
    agent: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    scheduler: Any = None,
    settings: Optional[Settings] = None,
    precision: Optional[PrecisionRequest] = None,
    overrides: Optional[dict[str, Any]] = None,
    **kwargs: Any,
) -> FP16Trainer:
    """The trainer ``agent`` should use now (`resolve_trainer` without the
    policy): global settings, then its profile, then explicit arguments, then
    the rollout ledger and the kill switch."""
    return resolve_trainer(
        agent,
        model,
        optimizer,
        scheduler=scheduler,
        settings=settings,
        precision=precision,
        overrides=overrides,
        **kwargs,
    ).trainer
