"""The rollout part: per agent, from FP32 to reduced precision and back. The ledger (`rollout.ledger`: stages,
history, quality checks, the guard's state, in SQLite in the state dir), the effective policy of an agent
(`rollout.policy`: settings < profile < argument, then the ledger stage and the kill switch, as one typed request),
profiles (`rollout.profiles`), the rollback guard and its pure rules (`rollout.guard`, `rollout.judge`), the FP32
references (`rollout.canary`), the tuning command (`rollout.tuning`), the drill (`rollout.drill`) and the `rollout`
and `profiles` commands (`rollout.cli`)."""
