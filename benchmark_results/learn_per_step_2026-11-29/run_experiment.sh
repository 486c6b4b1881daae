#!/bin/bash
# The loop's variants: c5fd4aa with experiment.patch applied (a checkout at $WT), learn_per_step as GX_RATIO (0: off),
# GX_WHICH=wm: the world model's steps only. Output in the current folder.
#   usage: WT=/tmp/wt run_experiment.sh RATIO NAME ENV STEPS [EXTRA]     e.g. run_experiment.sh 2 idp2k_r2 InvertedDoublePendulum-v5 2000
#   (METHODS=... for another method than the loop; Hopper-v5 took --target 1500)
r=$1; name=$2; env=$3; steps=$4; shift 4
GX_RATIO=$r OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 PYTHONPATH=$WT python $WT/scripts/evolution_table.py \
  --env $env --seeds 1 2 3 4 5 --budget 100000 --budget-steps $steps --methods ${METHODS:-loop} \
  --cma-long-budget 0 --precision-steps 0 "$@" --out $name.json > $name.txt 2>&1
