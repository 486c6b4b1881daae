#!/usr/bin/env bash
# Every GPU check the issues ask for, in one command, for a machine with CUDA:
#
#   bash scripts/gpu_acceptance.sh [OUT_DIR]      (default: gpu_results/)
#
# 1. the GPU tests (pytest -m gpu: CUDA FP16 with the scaler, BF16, checkpoints, NCCL, pinned PPO, the captured
#    window against the eager one on clean data, a NaN storm and an FP16 overflow, the learners captured)
# 2. the benchmark matrix on CUDA (strict FP32, TF32, BF16, FP16; S, M, L, XL, LSTM: XL is a CUDA default), each
#    cell's training windows eager and captured (BENCH_REPEATS: repeats per cell, default 11; BENCH_ARGS: more
#    options), after the world model's train() calls, captured and eager (ensemble of 5, hidden 128 and 512)
# 3. the same matrix compiled (torch.compile) for sizes S and L
# 4. NCCL runs of the distributed trainer, world size = visible GPUs (at least 1), FP16 and BF16,
#    DDP and FSDP2, one with an injected overflow
# 5. the PPO update step on CUDA (FP32, AMP BF16, AMP FP16, torch.compile), and `genesis-fp16 ppo` on CUDA
#    (CartPole-v1, 30,720 steps) in FP32, FP16 (scaler) and BF16, each checked to have trained in that precision
# 6. the RLHF forensics on CUDA: the static probe at length 512 (fp16_pure, bf16_pure,
#    fp32_baseline) and a quick PPO sweep (one seed per configuration); the first
#    forensics command builds the FP32 initial checkpoint on the CPU (about 15 s) if missing
# 7. `genesis-fp16 evolve` (Pendulum-v1, 48 real episodes) with the world model on CUDA
#    (GENESIS_FP16_DEVICE=cuda, ON_UNSUPPORTED=error: no silent CPU fallback) in FP16 with the
#    scaler and in BF16; its events must show the world model and the critic trained on cuda in that precision
# 8. precision=auto by measurement on CUDA (scripts/auto_precision_table.py --device cuda) and the
#    decision a default-precision evolve on CUDA records (genesis-fp16 doctor --json)
#
# Each step writes its JSON (and a log) to OUT_DIR and the script goes on when
# one fails; the exit code is the number of failed steps. GPU_STEPS="pytest_gpu ppo evolve" runs only the
# steps whose names start with one of those words (a device lease too short for all of them). It refuses to start
# without CUDA: nothing here has a CPU fallback.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-gpu_results}"
PY="${PYTHON:-.venv/bin/python}"
TORCHRUN="${TORCHRUN:-$(dirname "$PY")/torchrun}"
mkdir -p "$OUT_DIR"

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_acceptance: no CUDA device visible to $PY; nothing to run" >&2
    exit 2
fi
NGPU="$("$PY" -c "import torch; print(torch.cuda.device_count())")"
"$PY" -m genesis_fp16.cli doctor --json > "$OUT_DIR/doctor.json" 2> "$OUT_DIR/doctor.log"
nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1 || true

failed=0
selected() {  # selected NAME: whether GPU_STEPS (default: every step) names a prefix of NAME
    [ -z "${GPU_STEPS:-}" ] && return 0
    local word
    for word in $GPU_STEPS; do [[ "$1" == "$word"* ]] && return 0; done
    return 1
}
step() {  # step NAME COMMAND...: run, log, count a failure, go on
    local name="$1"; shift
    selected "$name" || return 0
    local started; started=$(date +%s)
    echo "== $name: $*"
    if "$@" > "$OUT_DIR/$name.log" 2>&1; then
        echo "   ok ($(( $(date +%s) - started )) s)"
    else
        echo "   FAILED (exit $?, $(( $(date +%s) - started )) s): see $OUT_DIR/$name.log"
        failed=$((failed + 1))
    fi
}

step pytest_gpu "$PY" -m pytest -m gpu -q -rA -p no:cacheprovider --junitxml "$OUT_DIR/pytest_gpu.xml"
step wm_train_calls_cuda "$PY" scripts/bench_world_model.py --train-calls --device cuda --ensembles 5 \
    --hiddens 128,512 --layers 4 --steps 400 --json "$OUT_DIR/wm_train_calls_cuda.json"
# shellcheck disable=SC2086  # BENCH_ARGS: more bench options, word-split on purpose (e.g. "--precisions fp32,bf16,fp16")
step bench_cuda "$PY" -m genesis_fp16.cli bench --device cuda --repeats "${BENCH_REPEATS:-11}" ${BENCH_ARGS:-} \
    --json "$OUT_DIR/bench_cuda.json" --csv "$OUT_DIR/bench_cuda.csv" --markdown "$OUT_DIR/bench_cuda.md"
step bench_cuda_compile "$PY" -m genesis_fp16.cli bench --device cuda --compile --sizes S,L \
    --precisions fp32,bf16,fp16 --json "$OUT_DIR/bench_cuda_compile.json" --markdown "$OUT_DIR/bench_cuda_compile.md"
for wrap in ddp fsdp; do
    for prec in fp16 bf16; do
        step "nccl_${wrap}_${prec}" "$TORCHRUN" --standalone --nproc_per_node="$NGPU" scripts/train_distributed.py \
            --wrap "$wrap" --precision "$prec" --steps 300 --json "$OUT_DIR/nccl_${wrap}_${prec}.json"
    done
done
step nccl_ddp_fp16_overflow "$TORCHRUN" --standalone --nproc_per_node="$NGPU" scripts/train_distributed.py \
    --precision fp16 --steps 20 --inject-overflow-rank $((NGPU - 1)) --inject-step 5 \
    --json "$OUT_DIR/nccl_ddp_fp16_overflow.json"
step ppo_update_cuda "$PY" scripts/diagnose_performance.py --test update --device cuda \
    --json "$OUT_DIR/ppo_update_cuda.json"
check_ppo() {  # check_ppo JSON PRECISION: the run trained in PRECISION and its evaluation is finite
    "$PY" - "$1" "$2" <<'PYEOF'
import json, math, sys
data, precision = json.load(open(sys.argv[1])), sys.argv[2]
o = data["optimizations"]
print(f"ppo {data['env_id']}: {data['env_steps']} steps, {data['env_steps_per_s']:.0f} env steps/s, precision {o['precision']}, "
      f"eval {data['eval_return']}, overflow steps {data['trainer'].get('overflow_count')}, scale {data['trainer'].get('current_scale')}")
assert o["precision"] == precision, f"trained in {o['precision']}, asked {precision}"
assert math.isfinite(data["eval_return"])
PYEOF
}
for prec in fp32 fp16 bf16; do
    step "ppo_cuda_${prec}" "$PY" -m genesis_fp16.cli ppo --env CartPole-v1 --total-steps 30720 --seed 1 \
        --set device=cuda --set "optimizations.precision=${prec}" --json "$OUT_DIR/ppo_cuda_${prec}.json"
    step "ppo_cuda_${prec}_check" check_ppo "$OUT_DIR/ppo_cuda_${prec}.json" "$prec"
done
step forensics_probe_cuda "$PY" -m genesis_fp16.cli forensics probe --device cuda \
    --configs fp16_pure,bf16_pure,fp32_baseline --seq-lengths 512 --json "$OUT_DIR/forensics_probe_cuda.json"
step forensics_sweep_cuda "$PY" -m genesis_fp16.cli forensics sweep --device cuda --quick --seeds 1 \
    --out "$OUT_DIR/forensics_sweep_cuda" --json "$OUT_DIR/forensics_sweep_cuda.json"

check_wm_events() {  # check_wm_events STATE_DIR PRECISION: world_model.trained and critic.trained events on cuda in PRECISION
    "$PY" - "$1" "$2" <<'PYEOF'
import sys
from pathlib import Path
from genesis_fp16.base.telemetry import read_events
state, precision = Path(sys.argv[1]), sys.argv[2]
events = read_events(state / "events.jsonl", include_rotated=True)
for name in ("world_model.trained", "critic.trained"):
    trained = [e for e in events if e.get("event") == name]
    print(f"{len(trained)} {name} events: devices {sorted({e.get('device') for e in trained})}, "
          f"precisions {sorted({e.get('precision') for e in trained})}")
    assert trained, f"no {name} event"
    assert all(str(e.get("device", "")).startswith("cuda") for e in trained), f"{name}: off the GPU"
    assert all(e.get("precision") == precision for e in trained), f"{name}: expected every call in {precision}"
PYEOF
}
for prec in fp16 bf16; do
    state="$OUT_DIR/evolve_cuda_${prec}_state"
    rm -rf "$state"
    step "evolve_cuda_${prec}" env GENESIS_FP16_DEVICE=cuda GENESIS_FP16_ON_UNSUPPORTED=error GENESIS_FP16_STATE_DIR="$state" \
        "$PY" -m genesis_fp16.cli evolve --env Pendulum-v1 --budget 48 --seed 0 --precision "$prec" --critic-precision "$prec" \
        --json "$OUT_DIR/evolve_cuda_${prec}.json"
    step "evolve_cuda_${prec}_on_gpu" check_wm_events "$state" "$prec"
done

# 8. auto by measurement on CUDA: what it picks between FP16 (scaler) and BF16 for each workload,
#    against each precision at length, and the decision `evolve` records in the ledger (doctor)
step auto_precision_cuda "$PY" scripts/auto_precision_table.py --device cuda --repeats 3 \
    --json "$OUT_DIR/auto_precision_cuda.json"
state="$OUT_DIR/evolve_cuda_auto_state"
rm -rf "$state"
step evolve_cuda_auto env GENESIS_FP16_DEVICE=cuda GENESIS_FP16_ON_UNSUPPORTED=error GENESIS_FP16_STATE_DIR="$state" \
    "$PY" -m genesis_fp16.cli evolve --env Pendulum-v1 --budget 48 --seed 0 --json "$OUT_DIR/evolve_cuda_auto.json"
step evolve_cuda_auto_decision env GENESIS_FP16_STATE_DIR="$state" "$PY" -m genesis_fp16.cli doctor --json  # its log is the JSON

echo "gpu_acceptance: $failed step(s) failed; results in $OUT_DIR/"
exit "$failed"
