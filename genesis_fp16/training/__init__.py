"""The training part: `FP16TrainingConfig`, the trainer (`training.trainer`: both step paths, the per-step one and
the training window, with one accounting of a step and its checkpoints), the checkpoint file (`training.checkpoint`:
its format, atomic writes, `weights_only` reads and the checks of a payload), the registry of trainers by name
(`training.registry`) and guarded training (`training.guarded`: one agent trained under its rollout policy, its
precision decided once, its guard, good checkpoints, FP32 references and rollbacks). The trainer gets a decided
precision and reads no settings, ledger or measurement (docs/ARCHITECTURE.md)."""
