"""Each report's per-seed held-out return and CPU seconds, with the medians: ``python sum.py FILE.json ...``."""

import json
import statistics
import sys

for path in sys.argv[1:]:
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        print(path, "not ready")
        continue
    for method, runs in report["runs"].items():
        held = [r["heldout_return"] for r in runs]
        cpu = [r.get("cpu_s") or 0.0 for r in runs]
        print(
            f"{path:28s} {method:8s} held {' / '.join(f'{x:.1f}' for x in held)}  med {statistics.median(held):.1f}  "
            f"cpu {' / '.join(f'{x:.0f}' for x in cpu)} med {statistics.median(cpu):.0f}"
        )
