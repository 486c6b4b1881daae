"""The rollback drill: rehearse the rollback plan in a scratch state dir.

Each scenario runs the real code (ledger, guard, trainer, checkpoints, policy)
on a tiny model defined here, and reports ``passed`` with what it saw. The
drill forces ``enable_fp16_training=True`` in its scratch settings, so it
rehearses rollback even where the kill switch is on in the real environment,
and it never touches the real state dir: its ledger, checkpoints and event
log live in the scratch dir.

``runner`` holds the scenarios and `run_drill`; ``canary`` the FP32
canary's scenarios (``silent_degradation``, ``healthy_control``).
"""

from genesis_fp16.rollout.drill.common import REDUCED, ScenarioResult, TinyModel
from genesis_fp16.rollout.drill.runner import Drill, run_drill

__all__ = ["REDUCED", "Drill", "ScenarioResult", "TinyModel", "run_drill"]
