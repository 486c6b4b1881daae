#!/bin/bash
# The committed code (d7de4ca, learn_per_step 2 by default), a checkout at $WT. Output in the current folder.
#   usage: WT=/tmp/wt run.sh NAME ENV STEPS METHODS "SEEDS" [EXTRA]   e.g. run.sh nm_idp2k InvertedDoublePendulum-v5 2000 no_model "1 2 3 4 5"
name=$1; env=$2; steps=$3; methods=$4; seeds=$5; shift 5
OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 PYTHONPATH=$WT python $WT/scripts/evolution_table.py \
  --env $env --seeds $seeds --budget 100000 --budget-steps $steps --methods $methods \
  --cma-long-budget 0 --precision-steps 0 "$@" --out $name.json > $name.txt 2>&1
