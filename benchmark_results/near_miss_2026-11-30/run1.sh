#!/bin/bash
# usage: run1.sh NAME SEED NEAR [evolve flags]   one `genesis-fp16 evolve --seed SEED` in NAME/ (fresh state directory),
# the near-miss bar GX_NEAR (0: off) of experiment.patch; WT: a checkout of e3bf95e with experiment.patch applied
# (its .venv holds the install). At 45c3100 and later the rule is the default: drop GX_NEAR and PYTHONPATH.
name=$1; seed=$2; near=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$here/$name" && cd "$here/$name" && rm -rf "st$seed"
GX_NEAR=$near PYTHONPATH=$WT OMP_NUM_THREADS=1 GENESIS_FP16_STATE_DIR=st$seed /usr/bin/time -f "%U %S %e" -o t$seed.txt \
  "$WT/.venv/bin/genesis-fp16" evolve --seed $seed "$@" --json s$seed.json > log$seed.txt 2>&1
