#!/bin/bash
# The Pendulum-v1 row of docs/EVOLUTION.md's table at 1ace84d (the loop and the loop without the model at 1,600 actor
# steps a generation; the floor and SAC did not change: issue 55's reports) and its curve. Run from this folder. The
# reports came from:
#   python scripts/evolution_table.py --env Pendulum-v1 --target -100 --seeds 1 2 3 4 5 --budget 100000 \
#     --budget-steps 4000 --methods loop no_model --cma-long-budget 0 --precision-steps 0 --out loop_Pendulum_4000.json
P=${PYTHON:-python}; T=../../../scripts/evolution_table.py; L=../../loop55_2026-11-29
{
  echo "# Pendulum-v1 at 4,000 env steps, the loop at 1ace84d, host F"
  echo
  $P $T --summarize loop_Pendulum_4000.json $L/main_bbc1752/floor_Pendulum_4000.json $L/sac_Pendulum_4000.json --merge
} > summary.md
$P $T --summarize loop_Pendulum_4000.json --plot ../../../docs/evolution/issue55_Pendulum-v1.png > /dev/null
