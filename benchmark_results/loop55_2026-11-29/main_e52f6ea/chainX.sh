#!/bin/bash
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
P=/work/main/.venv/bin/python; T=/tmp/wtB/scripts/evolution_table.py
cd /work/main/benchmark_results/loop55_2026-11-29/main_e52f6ea
run() { local name=$1; shift; $P $T "$@" --seeds 1 2 3 4 5 --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
run loop_Swimmer_100000 --env Swimmer-v5 --methods loop --budget-steps 100000
mkdir -p pend_default
for s in 0 1 2 3 4; do
  mkdir -p /tmp/pd$s && (cd /tmp/pd$s && PYTHONPATH=/tmp/wtB $P -c "import sys; from genesis_fp16.cli import main; sys.argv[0]='genesis-fp16'; main()" evolve --seed $s --quiet --json /work/main/benchmark_results/loop55_2026-11-29/main_e52f6ea/pend_default/evolve_seed$s.json > /work/main/benchmark_results/loop55_2026-11-29/main_e52f6ea/pend_default/evolve_seed$s.txt 2>&1)
done
echo done > chainX.done
