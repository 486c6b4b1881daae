#!/bin/bash
# usage: CODE=<checkout> ./ev.sh NAME "EVOLVE ARGS" SEEDS... -> NAME.txt here: per seed, the report's stop, steps,
# held-out and answer lines (e.g. ./ev.sh ps01 "--env Pusher-v5 --budget-steps 10000 --sigma0 0.1" 1 2 3)
CODE=${CODE:-$(git rev-parse --show-toplevel)}
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 PYTHONPATH=$CODE
here=$(cd "$(dirname "$0")" && pwd)
name=$1; args=$2; shift 2
for s in "$@"; do
  d=$(mktemp -d)
  out=$(cd "$d" && GENESIS_FP16_STATE_DIR=$d/st "$CODE/.venv/bin/python" -m genesis_fp16.cli evolve $args --seed "$s" \
      --budget 100000 2>/dev/null | grep -i "held-out\|answer  \|env steps" | tr -s ' ' | head -4)
  echo "seed $s: $out" >> "$here/$name.txt"
done
