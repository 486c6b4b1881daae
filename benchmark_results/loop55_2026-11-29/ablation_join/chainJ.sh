#!/bin/bash
# InvertedDoublePendulum-v5 at 3,500 env steps: extras join only on a win (f78b45b) against join as parents once extras won lately (945a1b6)
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
P=/work/main/.venv/bin/python
cd /work/main/benchmark_results/loop55_2026-11-29/ablation_join
run() { local T=$1 name=$2; shift 2; $P $T/scripts/evolution_table.py "$@" --seeds 1 2 3 4 5 --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
run /tmp/wtW loop_InvertedDoublePendulum_3500_join_on_win --env InvertedDoublePendulum-v5 --methods loop --budget-steps 3500 &
run /tmp/wtC loop_InvertedDoublePendulum_3500_trusted --env InvertedDoublePendulum-v5 --methods loop --budget-steps 3500
wait
echo done > chainJ.done
