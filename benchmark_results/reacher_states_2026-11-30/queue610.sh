#!/bin/bash
# usage: ./queue610.sh NAME "ENV=VALUE ..." [XARGS]: seeds 6-8 and 9-10 of Reacher-v5 at 10,000 two at a time (CODE=checkout)
cd "$(dirname "$0")"
name=$1; vars=$2; export XARGS=$3
env $vars ./run2.sh ${name}_a Reacher-v5 10000 loop 6 7 8 &
env $vars ./run2.sh ${name}_b Reacher-v5 10000 loop 9 10 &
wait
grep -h "heldout=" ${name}_a.txt ${name}_b.txt | sed 's/.*seed \([0-9]*\).*heldout=\([-0-9.]*\).*cpu=\(.*\)/\1 \2 \3/' > ${name}.sum
