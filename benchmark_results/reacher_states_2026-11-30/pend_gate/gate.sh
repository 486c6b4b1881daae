#!/bin/bash
# usage: WT=<checkout with ../experiment.patch> VARS... ./gate.sh NAME SEEDS...: `genesis-fp16 evolve --seed S` (the
# default: Pendulum-v1, 200 episodes) -> NAME_seedS.json here; NAME.sum: seed, episodes to the target, held-out
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 PYTHONPATH=$WT
here=$(cd "$(dirname "$0")" && pwd); name=$1; shift
for s in "$@"; do
  d=$(mktemp -d)
  (cd $d && GENESIS_FP16_STATE_DIR=$d/st $WT/.venv/bin/python -m genesis_fp16.cli evolve --seed $s --json $here/${name}_seed$s.json > /dev/null 2>&1)
  rm -rf $d
  python3 -c "import json; d=json.load(open('$here/${name}_seed$s.json')); print($s, d['episodes_to_target'], round(d['heldout_return'], 1))" >> $here/$name.sum
done
