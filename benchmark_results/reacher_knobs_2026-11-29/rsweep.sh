#!/bin/bash
# What made these reports: `genesis-fp16 evolve` on Reacher-v5 at 10,000 env steps, the learners' precision pinned to
# what `auto` chose for issue 55's table on this host (world model BF16, critic FP32), one torch thread, each seed in
# its own state directory.
#   usage: rsweep.sh NAME "FLAGS" SEED...        e.g. rsweep.sh ref8 "--refined 8" 1 2 3 4 5
# Flag experiments ran at 66b6ede (ar16/ at d7de4ca: `rsweep.sh ar16 "--actor-rounds 16" 1 2 3 4 5`). Environment experiments ran at 66b6ede with experiment.patch applied (git apply):
# GX_ACTOR=persist (persist/), GX_ROLL=actor (rollact/), GX_CH=128 or 256 (ch128/, ch256/).
name=$1; flags=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
for s in "$@"; do
  mkdir -p "$here/work/$name/s$s"
  (cd "$here/work/$name/s$s" && OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 \
    genesis-fp16 evolve --env Reacher-v5 --budget 100000 --budget-steps 10000 --seed "$s" --precision bf16 \
      --critic-precision fp32 --quiet --json "$here/$name/s$s.json" $flags > out.txt 2>&1)
done
