"""Each `ev.sh` folder's per-seed held-out return, its median, the median CPU seconds and the real episodes:
``python evsum.py NAME ...``."""

import json
import os
import statistics
import sys

for name in sys.argv[1:]:
    held, cpu, episodes = [], [], []
    for seed in sorted(os.listdir(name)):
        try:
            with open(f"{name}/{seed}/report.json") as f:
                report = json.load(f)
            with open(f"{name}/{seed}/time.txt") as f:
                user, system = f.read().split()[-2:]
        except (OSError, ValueError):
            continue  # a seed still running, or stopped
        held.append((seed, report["heldout_return"]))
        cpu.append(float(user) + float(system))
        episodes.append(report["real_episodes"])
    if held:
        print(
            name,
            " / ".join(f"{seed}: {h:.2f}" for seed, h in held),
            f"median {statistics.median(h for _, h in held):.2f}",
            f"CPU s median {statistics.median(cpu):.0f}",
            "episodes",
            episodes,
        )
