#!/bin/bash
# usage: sweep.sh NAME NEAR "SEEDS" [evolve flags]   run1.sh for each seed, two at a time
#   WT=... ./sweep.sh evolve_fp32 0.5 "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14" --precision fp32 --critic-precision fp32
#   WT=... ./sweep.sh evolve_auto 0.5 "0 1 2 3 4 5 6 7 8 9"
name=$1; near=$2; seeds=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
for s in $seeds; do echo $s; done | xargs -P2 -I{} "$here/run1.sh" "$name" {} "$near" "$@"
