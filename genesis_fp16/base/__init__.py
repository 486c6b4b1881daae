"""The base every part stands on: settings (one pydantic-settings tree, the only reader of the environment) and the
names it refuses, telemetry (structlog events, the event log, the TensorBoard sink), storage (atomic writes, state
files read as untrusted input, SQLite faults), seeds (one function of seed and stream name), the device, errors,
agent names, torch threads, the terminal, lazy imports, the package-shadowing check and the optional extras.
Nothing here imports the precision, training or rollout parts."""
