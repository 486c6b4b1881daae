#!/bin/bash
# usage: WT=<e3bf95e with experiment2.patch> run2.sh NAME SEED [evolve flags]   the near-miss rule and a second extra verified (GX_HOPEFULS=2)
name=$1; seed=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd); mkdir -p "$here/$name"; cd "$here/$name"; rm -rf st$seed
GX_HOPEFULS=2 GX_NEAR=0.5 PYTHONPATH=$WT OMP_NUM_THREADS=1 GENESIS_FP16_STATE_DIR=st$seed $WT/.venv/bin/genesis-fp16 evolve --seed $seed "$@" --json s$seed.json > log$seed.txt 2>&1
