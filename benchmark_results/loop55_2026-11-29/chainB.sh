#!/bin/bash
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
P=/work/main/.venv/bin/python; T=/tmp/wt/scripts/evolution_table.py
cd /work/main/benchmark_results/loop55_2026-11-29
run() { local name=$1; shift; $P $T "$@" --seeds 1 2 3 4 5 --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
run table_Pendulum_4000 --env Pendulum-v1 --target -100 --methods loop floor --budget-steps 4000
run table_InvertedDoublePendulum_3500 --env InvertedDoublePendulum-v5 --methods loop floor --budget-steps 3500
run loop_Reacher_10000_mlp16 --env Reacher-v5 --policy mlp:16 --methods loop --budget-steps 10000
run table_Hopper_15000 --env Hopper-v5 --target 1500 --methods loop floor --budget-steps 15000
run table_Swimmer_100000 --env Swimmer-v5 --methods loop floor --budget-steps 100000
run table_Reacher_10000_floor --env Reacher-v5 --methods floor --budget-steps 10000
echo done > chainB.done
