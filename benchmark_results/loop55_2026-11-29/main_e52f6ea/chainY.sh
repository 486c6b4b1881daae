#!/bin/bash
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
P=/work/main/.venv/bin/python; T=/tmp/wtB/scripts/evolution_table.py
cd /work/main/benchmark_results/loop55_2026-11-29/main_e52f6ea
run() { local name=$1; shift; $P $T "$@" --seeds 1 2 3 4 5 --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
run loop_Hopper_15000 --env Hopper-v5 --target 1500 --methods loop --budget-steps 15000
run loop_InvertedDoublePendulum_3500 --env InvertedDoublePendulum-v5 --methods loop --budget-steps 3500
run loop_Pendulum_4000 --env Pendulum-v1 --target -100 --methods loop --budget-steps 4000
run loop_Reacher_10000 --env Reacher-v5 --methods loop --budget-steps 10000
run nomodel_Hopper_15000 --env Hopper-v5 --target 1500 --methods no_model --budget-steps 15000
run nomodel_InvertedDoublePendulum_3500 --env InvertedDoublePendulum-v5 --methods no_model --budget-steps 3500
run nomodel_Pendulum_4000 --env Pendulum-v1 --target -100 --methods no_model --budget-steps 4000
run nomodel_Reacher_10000 --env Reacher-v5 --methods no_model --budget-steps 10000
echo done > chainY.done
