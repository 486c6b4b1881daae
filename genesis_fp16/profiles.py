"""Per-agent tuning profiles (TOML). Placeholder layer: the rollout issue fills it in."""

from __future__ import annotations

from typing import Any

from .settings import Settings


def profile_layer(agent: str, settings: Settings) -> dict[str, Any]:
    """Trainer-config values and guard thresholds from ``agent``'s profile.

    Returns ``{"trainer": {...}, "thresholds": {...}, "source": path}``.
    """
    return {"trainer": {}, "thresholds": {}, "source": None}
