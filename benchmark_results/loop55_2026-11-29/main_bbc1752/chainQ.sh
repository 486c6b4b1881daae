#!/bin/bash
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
P=/work/main/.venv/bin/python; T=/tmp/wtF/scripts/evolution_table.py
cd /work/main/benchmark_results/loop55_2026-11-29/main_bbc1752
run() { local name=$1; shift; $P $T "$@" --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
S="--seeds 1 2 3 4 5"
run loop_Reacher_10000 $S --env Reacher-v5 --methods loop --budget-steps 10000
run table_InvertedPendulum_10000 $S --env InvertedPendulum-v5 --methods loop floor no_model --budget-steps 10000
run nomodel_InvertedDoublePendulum_3500 $S --env InvertedDoublePendulum-v5 --methods no_model --budget-steps 3500
run nomodel_Pendulum_4000 $S --env Pendulum-v1 --target -100 --methods no_model --budget-steps 4000
run nomodel_Hopper_15000 $S --env Hopper-v5 --target 1500 --methods no_model --budget-steps 15000
run nomodel_Reacher_10000 $S --env Reacher-v5 --methods no_model --budget-steps 10000
echo done > chainQ.done
