"""Rollout ledger. Placeholder: the rollout issue builds the SQLite ledger."""

from __future__ import annotations

from typing import Optional

from .settings import Settings


def current_stage(agent: str, settings: Settings) -> Optional[str]:
    """off | shadow | on | rolled_back, or None for an agent the ledger does not manage."""
    return None
