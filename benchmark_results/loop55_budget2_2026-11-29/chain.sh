#!/bin/bash
# usage: chain.sh "NAME|ENV|STEPS|EXTRA" ...   the table's second budget, the loop at 1ace84d's code
#   ./chain.sh "Pendulum_8000|Pendulum-v1|8000|--target -100" "Hopper_7500|Hopper-v5|7500|--target 1500"
#   ./chain.sh "InvertedPendulum_5000|InvertedPendulum-v5|5000|" "InvertedDoublePendulum_2000|InvertedDoublePendulum-v5|2000|" "Reacher_5000|Reacher-v5|5000|"
#   METHODS="loop floor" ./chain.sh "Swimmer_50000|Swimmer-v5|50000|"
cd "$(dirname "$0")"
for job in "$@"; do
  IFS='|' read -r name env steps extra <<< "$job"
  echo "$(date -u +%H:%M) $name"
  OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 python ../../scripts/evolution_table.py \
    --env $env --seeds 1 2 3 4 5 --budget 100000 --budget-steps $steps --methods ${METHODS:-loop floor no_model sac} \
    --cma-long-budget 0 --precision-steps 0 $extra --out $name.json > $name.txt 2>&1
done
echo "$(date -u +%H:%M) done"
