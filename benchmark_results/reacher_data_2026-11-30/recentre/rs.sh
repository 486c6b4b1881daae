#!/bin/bash
# usage: rs.sh NAME "ENV=.. ENV2=.." "FLAGS" SEED...
name=$1; envs=$2; flags=$3; shift 3
for s in "$@"; do
  mkdir -p $OUT/work/$name/s$s $OUT/$name
  (cd $OUT/work/$name/s$s && rm -rf st && env $envs PYTHONPATH=$WT OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 GENESIS_FP16_STATE_DIR=st \
    /usr/bin/time -f "%U %S %e" -o $OUT/$name/t$s.txt /work/main/.venv/bin/genesis-fp16 evolve --env Reacher-v5 --budget 100000 \
      --budget-steps 10000 --seed "$s" --precision bf16 --critic-precision fp32 --quiet --json $OUT/$name/s$s.json \
      $flags > out.txt 2>&1)
done
