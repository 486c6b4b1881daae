"""SB3 SAC with RL Zoo's Swimmer settings (gamma 0.9999, learning_starts 10000; the rest SB3's defaults), through the
table's own SAC baseline (`benchmarks.baselines.sac.run_sac`: the same budget, start states and held-out evaluation).

    PYTHONPATH=<checkout> OMP_NUM_THREADS=1 python zoo_sac.py SEED   # -> zoo_sac_sSEED.json here, one line to stdout
"""

import functools
import json
import sys
import time
from pathlib import Path

import stable_baselines3 as sb3
import torch

from benchmarks.baselines.common import BaselineConfig
from benchmarks.baselines.sac import run_sac

ZOO = {"gamma": 0.9999, "learning_starts": 10000}

torch.set_num_threads(1)
seed = int(sys.argv[1])
sb3.SAC = functools.partial(sb3.SAC, **ZOO)  # run_sac builds sb3.SAC("MlpPolicy", env, seed=..., verbose=0)
cpu = time.process_time()
report = run_sac(BaselineConfig(env_id="Swimmer-v5", seed=seed, budget=100000, budget_steps=100000))
report["settings"]["hyperparameters"] = f"RL Zoo's Swimmer settings {ZOO}, the rest SB3's defaults"
report["cpu_s_process"] = time.process_time() - cpu
out = Path(__file__).with_name(f"zoo_sac_s{seed}.json")
out.write_text(json.dumps(report, indent=1, default=str))
print(f"zoo_sac Swimmer-v5 100000 {seed} {report['heldout_return']} {report['cpu_s_process']:.1f}s")
