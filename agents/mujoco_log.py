"""Where MuJoCo writes its log.

MuJoCo appends every warning (an unstable simulation: NaN in QACC, too many
contacts) to ``MUJOCO_LOG.TXT``, a path relative to the current working
directory, so a run would leave that file wherever it was started. Each
process that may step a MuJoCo env (the evolve process, which makes the env
once to read its spaces, and every evaluation worker) points the log at the
state dir instead.

Standard library only at import: a spawned worker imports this from its
initializer, and mujoco itself is imported only where a task already uses it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from genesis_fp16.base.settings import Settings

LOG_NAME = "MUJOCO_LOG.TXT"


def mujoco_in_use() -> bool:
    """Whether this process has loaded mujoco (a MuJoCo env was made here);
    checked instead of importing it, which costs a Pendulum worker 0.2-0.4 s."""
    return "mujoco" in sys.modules


def route_mujoco_log(path: Path) -> None:
    """MuJoCo's log of this process goes to ``path`` (its directory is made)."""
    import mujoco

    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    if int(mujoco.__version__.split(".")[0]) >= 4:  # MjLogConfig: from MuJoCo 4.0 the log file is a setting
        config = mujoco.MjLogConfig.get()
        config.logfile = str(path)
        config.set()
        return

    def warning(message: str) -> None:  # older MuJoCo: its own handler only knows the cwd
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"WARNING {time.ctime()}: {message}\n\n")
        print(f"WARNING: {message}\n", flush=True)

    mujoco.set_mju_user_warning(warning)


def mujoco_log_for(settings: "Settings") -> Optional[Path]:
    """``<state_dir>/MUJOCO_LOG.TXT`` when this process uses MuJoCo, with this
    process's own log routed there already; ``None`` (nothing to route) otherwise."""
    if not mujoco_in_use():
        return None
    path = Path(settings.state_dir) / LOG_NAME
    route_mujoco_log(path)
    return path
