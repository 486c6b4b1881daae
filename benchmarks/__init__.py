"""Yardsticks the evolution loop is measured against, outside the installed
packages (pyproject's ``[tool.setuptools.packages.find]`` leaves this folder
out): ``benchmarks.baselines`` holds the model-free baselines (tuned CMA-ES,
ARS V2-t, Stable-Baselines3 SAC). Run from the repository root: this package
may import ``agents``, ``infrastructure`` and ``genesis_fp16``; nothing
installed imports it (tests/test_import_cycles.py)."""
