#!/bin/bash
# One `genesis-fp16 evolve` per seed, each in its own folder NAME/sS (report.json; time.txt: user and system CPU
# seconds), on a checkout of c94f0b1 at $WT. PREC: the world model's precision (bf16; the critic fp32, as `auto` picks
# on host F); BUDGET=" ": the default budget (Pendulum-v1's 40 episodes) instead of --budget-steps STEPS.
#   usage: WT=/tmp/wt ev.sh NAME ENV STEPS "SEEDS" [FLAGS]   e.g. ev.sh rea10_pop10 Reacher-v5 10000 "1 2 3 4 5" --popsize 10
name=$1; env=$2; steps=$3; seeds=$4; shift 4
for s in $seeds; do
  d=$PWD/$name/s$s; mkdir -p $d
  (cd $d && OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 PYTHONPATH=$WT /usr/bin/time -f "%U %S" -o time.txt \
    python -c "import sys; from genesis_fp16.cli import main; sys.exit(main())" evolve --env $env \
    ${BUDGET:---budget 100000 --budget-steps $steps} --seed $s --precision ${PREC:-bf16} --critic-precision fp32 \
    --quiet --json report.json "$@" > out.txt 2>&1)
done
