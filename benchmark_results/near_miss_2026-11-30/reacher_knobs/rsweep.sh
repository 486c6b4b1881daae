#!/bin/bash
# What made these reports: `genesis-fp16 evolve` on Reacher-v5 at 10,000 env steps at 45c3100 (the near-miss rule),
# the learners' precision pinned to what `auto` chose for issue 55's table on this host (world model BF16, critic
# FP32), one torch thread, each seed in its own state directory. t<seed>.txt: user and system CPU seconds.
#   usage: rsweep.sh NAME "FLAGS" SEED...        e.g. rsweep.sh ref8 "--refined 8" 1 2 3 4 5
# ch128/ ran with GX_CH=128 and the critic-width hunk of ../../reacher_knobs_2026-11-29/experiment.patch applied.
name=$1; flags=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
for s in "$@"; do
  mkdir -p "$here/work/$name/s$s" "$here/$name"
  (cd "$here/work/$name/s$s" && OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 GENESIS_FP16_STATE_DIR=st \
    /usr/bin/time -f "%U %S" -o "$here/$name/t$s.txt" genesis-fp16 evolve --env Reacher-v5 --budget 100000 \
      --budget-steps 10000 --seed "$s" --precision bf16 --critic-precision fp32 --quiet --json "$here/$name/s$s.json" \
      $flags > out.txt 2>&1)
done
