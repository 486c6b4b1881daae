"""The errors a command reports as one line, and the strict-JSON helper, in a
module that imports no torch.

``genesis_fp16.cli`` catches these at the top of every command; defining them
beside the code that raises them (checkpoint, device, precision, launch)
would make ``genesis-fp16 --help`` import torch (about 3 s of CPU). Their old
homes re-export them, so ``from genesis_fp16.training.checkpoint import CheckpointError``
still works and names the same class.
"""

from __future__ import annotations

import math
from typing import Any


class CheckpointError(RuntimeError):
    """A checkpoint could not be read or written; the message names the file."""


class DeviceUnavailableError(RuntimeError):
    """The device asked for (``GENESIS_FP16_DEVICE`` or a ``device=``
    argument) is not there and ``GENESIS_FP16_ON_UNSUPPORTED=error``."""


class UnsupportedPrecisionError(RuntimeError):
    """The device cannot run the precision asked for and ``GENESIS_FP16_ON_UNSUPPORTED=error``."""


class DistributedEnvError(RuntimeError):
    """The process was not started by torchrun, or its environment is half set."""


def strict_json_value(data: Any) -> Any:
    """``data`` with NaN and infinities as the strings "nan", "inf", "-inf":
    ``json.dumps`` would write bare NaN/Infinity tokens, which strict JSON
    parsers (jq, JavaScript) refuse."""
    if isinstance(data, float) and not math.isfinite(data):
        return "nan" if math.isnan(data) else ("inf" if data > 0 else "-inf")
    if isinstance(data, dict):
        return {k: strict_json_value(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [strict_json_value(v) for v in data]
    return data
