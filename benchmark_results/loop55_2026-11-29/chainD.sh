#!/bin/bash
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
P=/work/main/.venv/bin/python; T=/tmp/wt/scripts/evolution_table.py
cd /work/main/benchmark_results/loop55_2026-11-29
run() { local name=$1; shift; $P $T "$@" --seeds 1 2 3 4 5 --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
run loop_InvertedDoublePendulum_3500 --env InvertedDoublePendulum-v5 --methods loop --budget-steps 3500
run loop_InvertedDoublePendulum_3500_mlp8 --env InvertedDoublePendulum-v5 --policy mlp:8 --methods loop --budget-steps 3500
echo done > chainD.done
