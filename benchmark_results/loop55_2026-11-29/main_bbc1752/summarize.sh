#!/bin/bash
# The per-seed tables of summary.md and the curves docs/evolution/issue55_<task>.png, from the reports in this folder
# and its parent (floors and SAC did not change this round). Run from this folder.
P=${PYTHON:-python}; T=../../../scripts/evolution_table.py
{
  echo "# Per-seed tables (issue 55, the loop at bbc1752), host F"
  echo
  echo 'Made by `summarize.sh` (`python scripts/evolution_table.py --summarize FILES --merge`, one group of files per task).'
  echo 'Swimmer-v5: the loop ran at e52f6ea (`../main_e52f6ea`), whose rules decide alike wherever no extra ever wins,'
  echo 'as on every Swimmer seed here: seed 4 rerun at bbc1752 (`loop_Swimmer_100000_seed4.json`) gave the same held-out'
  echo 'return to the last digit. SAC on Reacher-v5 seeds 1-3: `../sac_Reacher_10000_seeds123.txt` (-7.75 / -5.84 / -5.87).'
  echo
  for g in \
    "loop_Pendulum_4000.json floor_Pendulum_4000.json nomodel_Pendulum_4000.json ../sac_Pendulum_4000.json" \
    "table_InvertedPendulum_10000.json sac_InvertedPendulum_10000.json" \
    "loop_InvertedDoublePendulum_3500.json ../floor_InvertedDoublePendulum_3500.json nomodel_InvertedDoublePendulum_3500.json ../sac_InvertedDoublePendulum_3500.json" \
    "loop_Reacher_10000.json ../table_Reacher_10000_floor.json nomodel_Reacher_10000.json ../sac_Reacher_10000_seeds45.json" \
    "loop_Hopper_15000.json floor_Hopper_15000.json nomodel_Hopper_15000.json ../sac_Hopper_15000.json" \
    "../main_e52f6ea/loop_Swimmer_100000.json floor_Swimmer_100000.json"; do
    $P $T --summarize $g --merge
    echo
  done
} > summary.md
for f in loop_Pendulum_4000:Pendulum-v1 table_InvertedPendulum_10000:InvertedPendulum-v5 \
         loop_InvertedDoublePendulum_3500:InvertedDoublePendulum-v5 loop_Reacher_10000:Reacher-v5 \
         loop_Hopper_15000:Hopper-v5 ../main_e52f6ea/loop_Swimmer_100000:Swimmer-v5; do
  $P $T --summarize ${f%%:*}.json --plot ../../../docs/evolution/issue55_${f##*:}.png > /dev/null
done
