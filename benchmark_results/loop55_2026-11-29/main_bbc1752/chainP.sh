#!/bin/bash
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
P=/work/main/.venv/bin/python; T=/tmp/wtF/scripts/evolution_table.py
cd /work/main/benchmark_results/loop55_2026-11-29/main_bbc1752
run() { local name=$1; shift; $P $T "$@" --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
S="--seeds 1 2 3 4 5"
run loop_InvertedDoublePendulum_3500 $S --env InvertedDoublePendulum-v5 --methods loop --budget-steps 3500
run loop_Hopper_15000 $S --env Hopper-v5 --target 1500 --methods loop --budget-steps 15000
run loop_Pendulum_4000 $S --env Pendulum-v1 --target -100 --methods loop --budget-steps 4000
for s in 0 1 2 3 4; do
  mkdir -p /tmp/pdF$s && (cd /tmp/pdF$s && PYTHONPATH=/tmp/wtF $P -c "import sys; from genesis_fp16.cli import main; sys.argv[0]='genesis-fp16'; main()" evolve --seed $s --quiet --json /work/main/benchmark_results/loop55_2026-11-29/main_bbc1752/pend_default/evolve_seed$s.json > /work/main/benchmark_results/loop55_2026-11-29/main_bbc1752/pend_default/evolve_seed$s.txt 2>&1)
done
run loop_Swimmer_100000_seed4 --seeds 4 --env Swimmer-v5 --methods loop --budget-steps 100000
run sac_InvertedPendulum_10000 $S --env InvertedPendulum-v5 --methods sac --sac-steps 10000 --budget-steps 10000
echo done > chainP.done
