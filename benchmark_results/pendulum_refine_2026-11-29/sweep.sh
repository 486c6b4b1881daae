#!/bin/bash
# What made these reports: `genesis-fp16 evolve` (Pendulum-v1, no other flag but FLAGS) on each seed, each in its own
# state directory, one torch thread.
#   usage: sweep.sh NAME "FLAGS" SEED...      e.g. sweep.sh rs1600 "--refine-steps 1600" 0 1 2 3 4 5 6 7 8 9
# The reports in default/, rs1600/, rs3200/, rh3/, cu4/ ran at 66b6ede (where the default was 800 steps) with FLAGS
# "", "--refine-steps 1600", "--refine-steps 3200", "--refine-horizon 3", "--critic-updates 4".
name=$1; flags=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
for s in "$@"; do
  mkdir -p "$here/work/$name/s$s"
  (cd "$here/work/$name/s$s" && OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 \
    genesis-fp16 evolve --seed "$s" --quiet --json "$here/$name/s$s.json" $flags > out.txt 2>&1)
done
