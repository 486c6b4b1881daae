#!/bin/bash
# after chainX: InvertedPendulum-v5 at 10,000 env steps, every method
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
P=/work/main/.venv/bin/python; T=/tmp/wtB/scripts/evolution_table.py
cd /work/main/benchmark_results/loop55_2026-11-29/main_e52f6ea
while [ ! -f chainX.done ]; do sleep 20; done
run() { local name=$1; shift; $P $T "$@" --seeds 1 2 3 4 5 --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
run table_InvertedPendulum_10000 --env InvertedPendulum-v5 --methods loop floor no_model --budget-steps 10000
run sac_InvertedPendulum_10000 --env InvertedPendulum-v5 --methods sac --sac-steps 10000 --budget-steps 10000
echo done > chainZ.done
