#!/bin/bash
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 GX_POPFIRST=1 PYTHONPATH=/tmp/WT
P=/work/main/.venv/bin/python; T=/tmp/WT/scripts/evolution_table.py
cd "$(dirname "$0")"
run() { local name=$1; shift; $P $T "$@" --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
if [ "$1" = A ]; then
run loop_Swimmer_100000 --env Swimmer-v5 --methods loop --budget-steps 100000 --seeds 3 1 2 4 5
run loop_InvertedDoublePendulum_3500 --env InvertedDoublePendulum-v5 --methods loop --budget-steps 3500 --seeds 1 2 3 4 5
else
run loop_HalfCheetah_50000 --env HalfCheetah-v5 --methods loop --budget-steps 50000 --seeds 5 1 2 3 4
run loop_Hopper_15000 --env Hopper-v5 --target 1500 --methods loop --budget-steps 15000 --seeds 1 2 3 4 5
fi
echo done > chain$1.done
