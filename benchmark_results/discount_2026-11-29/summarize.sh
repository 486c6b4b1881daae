#!/bin/bash
# summary.md, per seed: Hopper-v5's loop at the discount 0.995 (a823cf1_patch) and the loop without the model
# (c94f0b1) at 15,000 and 7,500 env steps; at 15,000 on seeds 6-10 the loop and the floor (c94f0b1) and the loop at
# 0.99 (a823cf1_patch). And the curve docs/evolution/issue55_Hopper-v5.png. Run from this folder. The floors and SAC
# of the rows: ../loop55_2026-11-29/main_bbc1752/summary.md, ../loop55_budget2_2026-11-29/summary.md.
P=${PYTHON:-python}; T=../../scripts/evolution_table.py
{
  echo "# Per-seed tables (issue 55, Hopper-v5's discount 0.995), host F"
  echo
  echo 'Made by `summarize.sh` (`python scripts/evolution_table.py --summarize FILES --merge`).'
  echo
  for g in "a823cf1_patch/hop15_g995.json c94f0b1/nm_hop15.json" "a823cf1_patch/hop75_g995.json c94f0b1/nm_hop75.json" \
           c94f0b1/hop15_s610_d995.json a823cf1_patch/hop15_s610_d99.json; do
    $P $T --summarize $g --merge
    echo
  done
} > summary.md
$P $T --summarize a823cf1_patch/hop15_g995.json --plot ../../docs/evolution/issue55_Hopper-v5.png > /dev/null
