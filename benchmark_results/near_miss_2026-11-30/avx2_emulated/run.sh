#!/bin/bash
# usage: run.sh SEED   `genesis-fp16 evolve --seed SEED` (f56d20e) with torch and oneDNN held to AVX2, a fresh precision cache
s=$1; cd "$(dirname "$0")" && rm -rf state$s
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 GENESIS_FP16_STATE_DIR=state$s GENESIS_FP16_PRECISION_CACHE=cache$s.json \
  /usr/bin/time -f "%U %S %e" -o t$s.txt genesis-fp16 evolve --seed $s --quiet --json seed$s.json > log$s.txt 2>&1
