#!/bin/bash
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
P=/work/main/.venv/bin/python; T=/tmp/wt/scripts/evolution_table.py
cd /work/main/benchmark_results/loop55_2026-11-29
while pgrep -f "nomodel_Reacher_10000" > /dev/null; do sleep 5; done
run() { local name=$1; shift; $P $T "$@" --seeds 1 2 3 4 5 --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
run nomodel_Hopper_15000 --env Hopper-v5 --target 1500 --methods no_model --budget-steps 15000
echo done > chainE.done
