"""Per run: real episodes to the confirmed target and held-out return, then each generation's refined candidates
(operator, one-episode return, episodes run on it) and its confirmations.

    cd benchmark_results/pendulum_refine_2026-11-29 && python show.py rs1600/*.json
"""

import json
import statistics
import sys


def main(paths: list[str]) -> None:
    episodes = []
    for path in paths:
        report = json.load(open(path))
        episodes.append(report["episodes_to_target"])
        print(path, report["episodes_to_target"], round(report["heldout_return"], 1))
        for gen in report["generations"]:
            extras = [
                (c["operator"], round(c["real_return"]), c["episodes"])
                for c in gen["candidates"]
                if c["operator"] != "cma"
            ]
            confirmed = [(c["episodes"], c["confirmed"], round(c["validation_return"])) for c in gen["confirmations"]]
            print(f"  gen {gen['generation']} at {gen['real_episodes']}: extras {extras} confirmed {confirmed}")
    reached = [e for e in episodes if e is not None]
    if reached:
        print(f"median {statistics.median(reached)}, at most 40 on {sum(e <= 40 for e in reached)} of {len(episodes)}")


if __name__ == "__main__":
    main(sys.argv[1:])
