#!/bin/bash
# usage: chain.sh A|B   issue 55's table on seeds 6-10: the loop (f56d20e) and SB3 SAC
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
cd "$(dirname "$0")"
P=${PYTHON:-python}; T=${TABLE:-../../../scripts/evolution_table.py}
run() { local name=$1; shift; $P $T "$@" --seeds 6 7 8 9 10 --budget 100000 --precision-steps 0 --cma-long-budget 0 --methods loop sac --out $name.json > $name.txt 2>&1; }
if [ "$1" = A ]; then
  run Reacher_10000 --env Reacher-v5 --budget-steps 10000
else
  run InvertedDoublePendulum_3500 --env InvertedDoublePendulum-v5 --budget-steps 3500
  run Pendulum_4000 --env Pendulum-v1 --target -100 --budget-steps 4000
fi
echo done > chain$1.done
