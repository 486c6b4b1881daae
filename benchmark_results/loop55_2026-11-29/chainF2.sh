#!/bin/bash
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
P=/work/main/.venv/bin/python; T=/tmp/wt/scripts/evolution_table.py
cd /work/main/benchmark_results/loop55_2026-11-29
$P $T --env Hopper-v5 --target 1500 --seeds 1 2 3 4 5 --methods sac --sac-steps 15000 --budget 100000 --budget-steps 15000 --precision-steps 0 --cma-long-budget 0 --out sac_Hopper_15000.json > sac_Hopper_15000.txt 2>&1
echo done > chainF.done
