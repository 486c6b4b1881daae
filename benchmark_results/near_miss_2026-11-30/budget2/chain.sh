#!/bin/bash
# usage (45c3100): ./chain.sh "Reacher_5000|Reacher-v5|5000|" "Pendulum_8000|Pendulum-v1|8000|--target -100" "InvertedPendulum_5000|InvertedPendulum-v5|5000|"
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1
cd "$(dirname "$0")"
for job in "$@"; do
  IFS='|' read -r name env steps extra <<< "$job"
  python ../../../scripts/evolution_table.py --env $env --seeds 1 2 3 4 5 --budget 100000 --budget-steps $steps --methods loop \
    --cma-long-budget 0 --precision-steps 0 $extra --out $name.json > $name.txt 2>&1
done
echo done > chain.done
