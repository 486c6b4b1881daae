#!/bin/bash
# usage: WT=<checkout (with mix.patch for GX_ROLL_MIX)> [GX_ROLL_MIX=F] [METHOD=loop|sac|floor] ./one.sh NAME ENV STEPS
# SEED [EXTRA FLAGS]: one seed of scripts/evolution_table.py --methods METHOD (default: loop) -> NAME_ENV_STEPS_sSEED.json
# and .txt here, and a line "NAME ENV STEPS SEED held-out CPU-s GX_ROLL_MIX" in results.txt; ENV "evolve": `genesis-fp16
# evolve --seed SEED` (STEPS ignored; the line holds the episodes to the target and the held-out return); ENV
# "cli:TASK": `genesis-fp16 evolve --env TASK --budget-steps STEPS --budget 100000 --seed SEED [EXTRA FLAGS]` (the line
# holds the held-out return and the CPU seconds)
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 PYTHONPATH=$WT
here=$(cd "$(dirname "$0")" && pwd); name=$1; env=$2; steps=$3; seed=$4; shift 4
P=$WT/.venv/bin/python; out=$here/${name}_${env#cli:}_${steps}_s$seed
if [ "$env" = evolve ]; then
  d=$(mktemp -d)
  (cd $d && GENESIS_FP16_STATE_DIR=$d/st $P -m genesis_fp16.cli evolve --seed $seed --json $out.json > $out.txt 2>&1)
  rm -rf $d
  line=$($P -c "import json; d=json.load(open('$out.json')); print(d['episodes_to_target'], round(d['heldout_return'], 1))")
elif [ "${env#cli:}" != "$env" ]; then
  d=$(mktemp -d)
  (cd $d && GENESIS_FP16_STATE_DIR=$d/st /usr/bin/time -f "%U %S" -o $out.cpu $P -m genesis_fp16.cli evolve --env ${env#cli:} \
      --budget-steps $steps --budget 100000 --seed $seed "$@" --json $out.json > $out.txt 2>&1)
  rm -rf $d
  line=$($P -c "import json; d=json.load(open('$out.json')); u, s = map(float, open('$out.cpu').read().split()); print(d['heldout_return'], f'{u + s:.1f}s')")
else
  $P $WT/scripts/evolution_table.py --env $env --budget-steps $steps --seeds $seed --methods ${METHOD:-loop} --budget 100000 \
    --precision-steps 0 --cma-long-budget 0 "$@" --out $out.json > $out.txt 2>&1
  line=$(grep -h "heldout=" $out.txt | sed 's/.*heldout=\([-0-9.]*\).*cpu=\(.*\)/\1 \2/')
fi
echo "$name $env $steps $seed $line ${GX_ROLL_MIX:-0}" >> $here/results.txt
