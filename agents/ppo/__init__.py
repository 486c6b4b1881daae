"""PPO with vectorized environments and the training-speed optimizations
(vectorized envs, AMP through FP16Trainer, torch.compile, pinned memory,
batched inference, action repeat). See docs/PPO.md."""

from genesis_fp16.base.lazy import lazy_exports

# imported on first use: registering `genesis-fp16 ppo` imports this package, and `--help` must not import torch
__all__ = ["ConfigError", "Optimizations", "PPOConfig", "load_config"]
__getattr__, __dir__ = lazy_exports(__name__, {name: ".config" for name in __all__}, __all__)
