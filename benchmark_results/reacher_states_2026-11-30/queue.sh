#!/bin/bash
# usage: ./queue.sh NAME "ENV=VALUE ..." [XARGS]: Reacher-v5 at 10,000 on seeds A="1 2 3" and B="4 5", two runs at a
# time (CODE=checkout; queue610.sh: seeds 6-8 and 9-10), through ../unseen_tasks_2026-11-30/run2.sh; NAME.sum: seed, held-out return, CPU seconds
cd "$(dirname "$0")"
name=$1; vars=$2; export XARGS=$3
env $vars OUT=$PWD ../unseen_tasks_2026-11-30/run2.sh ${name}_a Reacher-v5 10000 loop ${A:-1 2 3} &
env $vars OUT=$PWD ../unseen_tasks_2026-11-30/run2.sh ${name}_b Reacher-v5 10000 loop ${B:-4 5} &
wait
grep -h "heldout=" ${name}_a.txt ${name}_b.txt | sed 's/.*seed \([0-9]*\).*heldout=\([-0-9.]*\).*cpu=\(.*\)/\1 \2 \3/' > ${name}.sum
