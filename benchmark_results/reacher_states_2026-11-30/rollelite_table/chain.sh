#!/bin/bash
# usage: WT=<checkout with ../experiment.patch> GX_ROLL_ELITE=1 ./chain.sh A (and ./chain.sh B beside it)
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 PYTHONPATH=$WT
P=$WT/.venv/bin/python; T=$WT/scripts/evolution_table.py
cd "$(dirname "$0")"
run() { local name=$1; shift; $P $T "$@" --budget 100000 --precision-steps 0 --cma-long-budget 0 --out $name.json > $name.txt 2>&1; }
if [ "$1" = A ]; then
run loop_Hopper_15000 --env Hopper-v5 --target 1500 --methods loop --budget-steps 15000 --seeds 1 2 3 4 5
run loop_Swimmer_100000_a --env Swimmer-v5 --methods loop --budget-steps 100000 --seeds 1 2
else
run loop_Pendulum_4000 --env Pendulum-v1 --target -100 --methods loop --budget-steps 4000 --seeds 1 2 3 4 5
run loop_InvertedDoublePendulum_3500 --env InvertedDoublePendulum-v5 --methods loop --budget-steps 3500 --seeds 1 2 3 4 5
for s in 0 1 2 3 4; do
  d=$(mktemp -d)
  (cd $d && GENESIS_FP16_STATE_DIR=$d/st $P -m genesis_fp16.cli evolve --seed $s --json $OLDPWD/evolve_default_seed$s.json > /dev/null 2>&1)
  rm -rf $d
done
run loop_InvertedPendulum_10000 --env InvertedPendulum-v5 --methods loop --budget-steps 10000 --seeds 1 2 3 4 5
run loop_Swimmer_100000_b --env Swimmer-v5 --methods loop --budget-steps 100000 --seeds 3 4 5
fi
echo done > chain$1.done
