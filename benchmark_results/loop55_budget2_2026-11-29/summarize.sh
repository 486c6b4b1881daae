#!/bin/bash
# The per-seed tables of summary.md (the table's second budget, issue 55) from the reports in this folder. Run from
# this folder. What made them: chain.sh (one `scripts/evolution_table.py` call per task, the loop at 1ace84d):
#   Pendulum-v1 8,000 (--target -100), InvertedPendulum-v5 5,000, InvertedDoublePendulum-v5 2,000, Reacher-v5 5,000,
#   Hopper-v5 7,500 (--target 1500): --methods loop floor no_model sac; Swimmer-v5 50,000: --methods loop floor.
P=${PYTHON:-python}; T=../../scripts/evolution_table.py
{
  echo "# Per-seed tables (issue 55, the table's second budget, the loop at 1ace84d), host F"
  echo
  echo 'Made by `summarize.sh` (`python scripts/evolution_table.py --summarize FILE --merge`, one report per task).'
  echo
  for f in Pendulum_8000 InvertedPendulum_5000 InvertedDoublePendulum_2000 Reacher_5000 Hopper_7500 Swimmer_50000; do
    [ -f $f.json ] || continue
    $P $T --summarize $f.json --merge
    echo
  done
} > summary.md
