"""PPO with vectorized environments and the training-speed optimizations
(vectorized envs, AMP through FP16Trainer, torch.compile, pinned memory,
batched inference, action repeat). See docs/PPO.md."""

from .config import ConfigError, Optimizations, PPOConfig, load_config

__all__ = ["ConfigError", "Optimizations", "PPOConfig", "load_config"]
