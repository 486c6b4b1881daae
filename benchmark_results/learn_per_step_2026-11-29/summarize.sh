#!/bin/bash
# summary.md (per seed: the loop at --learn-per-step 2 and the loop without the model at d7de4ca, one table per task
# and budget) and the curves docs/evolution/issue55_<task>.png of the three tasks this changed. Run from this folder.
# The floors and SAC of the same rows: ../loop55_2026-11-29/main_bbc1752/summary.md, ../loop55_budget2_2026-11-29/summary.md.
P=${PYTHON:-python}; T=../../scripts/evolution_table.py
{
  echo "# Per-seed tables (issue 55, --learn-per-step 2), host F"
  echo
  echo 'Made by `summarize.sh` (`python scripts/evolution_table.py --summarize FILES --merge`).'
  echo
  for g in "r2/idp35_r2.json d7de4ca/nm_idp35.json" "r2/idp2k_r2.json d7de4ca/nm_idp2k.json" \
           "r2/ip10k_r2.json d7de4ca/nm_ip10k.json" "r2/ip5k_r2.json d7de4ca/nm_ip5k.json" \
           "r2/hop15k_r2.json d7de4ca/nm_hop15k.json" "r2/hop75_r2.json d7de4ca/nm_hop75.json" \
           "d7de4ca/hc50k_loop.json d7de4ca/hc50k_floor.json $(ls d7de4ca/hc50k_sac_s*.json 2>/dev/null)"; do
    $P $T --summarize $g --merge
    echo
  done
} > summary.md
for f in r2/ip10k_r2:InvertedPendulum-v5 r2/idp35_r2:InvertedDoublePendulum-v5 r2/hop15k_r2:Hopper-v5 \
         d7de4ca/hc50k_loop:HalfCheetah-v5; do
  $P $T --summarize ${f%%:*}.json --plot ../../docs/evolution/issue55_${f##*:}.png > /dev/null
done
