#!/bin/bash
# One evolution_table.py report: a checkout at $WT (a823cf1 with experiment.patch applied, GX_GAMMA=<discount> and
# GX_TOPK=<finals> set as the file names say; or c94f0b1 as it is). Output in the current folder.
#   usage: WT=/tmp/wt [SEEDS="6 7 8 9 10"] run.sh NAME ENV STEPS "METHODS" [EXTRA]
#   e.g.   WT=/tmp/wt GX_GAMMA=0.995 run.sh hop15_g995 Hopper-v5 15000 loop --target 1500
name=$1; env=$2; steps=$3; methods=$4; shift 4
OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 PYTHONPATH=$WT python $WT/scripts/evolution_table.py \
  --env $env --seeds ${SEEDS:-1 2 3 4 5} --budget 100000 --budget-steps $steps --methods $methods \
  --cma-long-budget 0 --precision-steps 0 "$@" --out $name.json > $name.txt 2>&1
