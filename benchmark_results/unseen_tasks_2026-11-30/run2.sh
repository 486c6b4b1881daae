#!/bin/bash
# usage: CODE=<a checkout of the commit named in README.md> ./run2.sh NAME ENV STEPS "METHODS" SEEDS...
# writes NAME.json and NAME.txt here, or in OUT (XARGS: more evolution_table.py flags, e.g. "--policy mlp:16")
CODE=${CODE:-$(git rev-parse --show-toplevel)}
export OMP_NUM_THREADS=1 GENESIS_FP16_TORCH_THREADS=1 PYTHONPATH=$CODE
here=${OUT:-$(cd "$(dirname "$0")" && pwd)}
name=$1; env=$2; steps=$3; methods=$4; shift 4
extra=""; [ "$env" = Walker2d-v5 ] && extra="--target 1500"
"$CODE/.venv/bin/python" "$CODE/scripts/evolution_table.py" --env "$env" $extra --methods $methods $XARGS \
    --budget-steps "$steps" --seeds "$@" --budget 100000 --precision-steps 0 --cma-long-budget 0 \
    --out "$here/$name.json" > "$here/$name.txt" 2>&1
