#!/usr/bin/env bash
# The GPU lane and the GPU benchmarks in one run of under 7 minutes, ending with one table.
#
#   bash benchmarks/gpu_check.sh                         # on the GPU machine, from the repo root
#   GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh    # dry run on the CPU, tiny sizes
#
# 1. installs the wheels in .whl/ (benchmarks/gpu_wheels.sh downloads them; the GPU machine has
#    no network) into /tmp/site and puts it and the repo on PYTHONPATH;
# 2. prints the GPU and the versions;
# 3. runs the tests marked gpu (tests/test_gpu.py, the CUDA cases of tests/test_encoders.py):
#    pytest -m gpu -n 8, 2 threads per test;
# 4. benchmarks/learner_update.py --device cuda for three networks (MLP [256, 256] 4000/128/10,
#    MLP [1024, 1024] 65536/4096/2, Atari Nature CNN 1024/256/4), with --cuda-graphs when the
#    script has it;
# 5. benchmarks/off_policy.py (our DQN on CartPole, SAC on Pendulum) with --device cuda and
#    --device cpu, the two side by side (1 thread each), when the script has --device;
# 6. prints one markdown table of all of it (benchmarks/_gpu_table.py).
#
# Every section runs under its own `timeout` and the script goes on when one fails; each
# section's limit leaves room for the ones after it (GPU_CHECK_BUDGET_S, default 420 s, is the
# whole run). Logs go to $OUT when it is set, else ./gpu_check_out.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
DEVICE=${GPU_CHECK_DEVICE:-cuda}
OUT_DIR=${OUT:-$REPO/gpu_check_out}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
# The dry run on a (slow, shared) CPU gets 3x every limit.
CAP_SCALE=1
[ "$DEVICE" = cpu ] && CAP_SCALE=3
BUDGET_S=${GPU_CHECK_BUDGET_S:-$((420 * CAP_SCALE))}
START=$(date +%s)
SECTIONS="$OUT_DIR/sections.tsv"
printf 'section\trc\tseconds\tlog\n' >"$SECTIONS"
PY=${PYTHON:-python3}

elapsed() { echo $(($(date +%s) - START)); }
remaining() { echo $((BUDGET_S - $(elapsed))); }

# run_section NAME CAP_S RESERVE_S LOG COMMAND...: COMMAND under `timeout`, at most CAP_S seconds and
# never into the RESERVE_S seconds the later sections need; its output goes to LOG.
run_section() {
  local name=$1 cap=$(($2 * CAP_SCALE)) reserve=$(($3 * CAP_SCALE)) log=$4
  shift 4
  local limit=$(($(remaining) - reserve))
  ((limit > cap)) && limit=$cap
  local t0 rc
  t0=$(date +%s)
  if ((limit < 10)); then
    echo "[$name] skipped: no time left (${limit}s)" | tee "$log"
    rc=125
  else
    echo "[$name] (limit ${limit}s) $*"
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    ((rc == 124 || rc == 137)) && echo "[$name] TIMED OUT after ${limit}s" | tee -a "$log"
  fi
  local took=$(($(date +%s) - t0))
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$took" "$log" >>"$SECTIONS"
  echo "[$name] exit $rc, ${took}s (total $(elapsed)s)"
  return 0
}

echo "== gpu_check: device=$DEVICE, logs in $OUT_DIR, budget ${BUDGET_S}s"

# ---- 1. wheels --------------------------------------------------------------------------
SITE=/tmp/site
if [ "$DEVICE" != cpu ] || [ "${GPU_CHECK_INSTALL:-0}" = 1 ]; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    run_section install 60 340 "$OUT_DIR/install.log" \
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
  else
    echo "[install] no .whl/ here (run bash benchmarks/gpu_wheels.sh where there is a network)"
  fi
fi
export PYTHONPATH="$SITE:$REPO:${PYTHONPATH:-}"
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
export MPLBACKEND=Agg SDL_VIDEODRIVER=dummy

# ---- 2. machine and versions ------------------------------------------------------------
{
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  "$PY" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "lightning", "gymnasium", "jsonargparse", "numpy", "onnxruntime", "mujoco", "pettingzoo", "minari"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as error:  # noqa: BLE001: a missing package is a line, not a failure
        print(name, "MISSING", type(error).__name__)
import torch
print("cuda available:", torch.cuda.is_available(), torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
EOF
} 2>&1 | tee "$OUT_DIR/versions.log"
printf '%s\t%s\t%s\t%s\n' versions 0 "$(elapsed)" "$OUT_DIR/versions.log" >>"$SECTIONS"

# ---- 3. the test lane -------------------------------------------------------------------
LANE_FILES=$(grep -l "pytest.mark.gpu" tests/test_*.py | tr '\n' ' ')
PYTEST_ARGS=(-m gpu -p no:cacheprovider -q -rfEs --continue-on-collection-errors --junitxml "$OUT_DIR/lane.xml")
# pyproject.toml's addopts ask for xdist's -n: without xdist, the lane clears them (-o addopts=).
if "$PY" -c "import xdist" 2>/dev/null; then
  PYTEST_ARGS+=(-n "${GPU_CHECK_WORKERS:-8}")
else
  PYTEST_ARGS+=(-o addopts=)
fi
"$PY" -c "import pytest_timeout" 2>/dev/null && PYTEST_ARGS+=(--timeout 200)
LANE_ENV=()
LANE_K=${GPU_CHECK_LANE_K:-}
if [ "$DEVICE" = cpu ]; then
  LANE_ENV=(env LIGHTNING_RL_GPU_LANE=cpu)
  # The dry run: a few of the lane's tests (the whole lane on 2 CPU cores takes some 15 minutes).
  LANE_K=${GPU_CHECK_LANE_K:-"ppo_cartpole.yaml or covers or gpu_checkpoint or test_encoders"}
fi
[ -n "$LANE_K" ] && PYTEST_ARGS+=(-k "$LANE_K")
# shellcheck disable=SC2086  # LANE_FILES: one word per file
run_section "test lane" 220 220 "$OUT_DIR/lane.log" "${LANE_ENV[@]}" "$PY" -m pytest "${PYTEST_ARGS[@]}" $LANE_FILES
tail -n 30 "$OUT_DIR/lane.log"

# ---- 4. the update on the GPU -----------------------------------------------------------
LU=(benchmarks/learner_update.py --device "$DEVICE" --threads 1)
if "$PY" benchmarks/learner_update.py --help 2>/dev/null | grep -q -- --cuda-graphs; then
  [ "$DEVICE" = cpu ] || LU+=(--cuda-graphs)
else
  echo "[learner_update] no --cuda-graphs in this version: the CUDA-graph variant is left out"
fi
if [ "$DEVICE" = cpu ]; then
  MLP_SMALL=(--hiddens 32 32 --batch-size 256 --minibatch-size 64 --epochs 1 --repeats 3)
  MLP_LARGE=(--hiddens 64 64 --batch-size 512 --minibatch-size 256 --epochs 1 --repeats 3)
  CNN=(--observations atari --hiddens 64 --batch-size 32 --minibatch-size 16 --epochs 1 --repeats 2)
else
  MLP_SMALL=(--hiddens 256 256 --batch-size 4000 --minibatch-size 128 --epochs 10 --repeats 6)
  MLP_LARGE=(--hiddens 1024 1024 --batch-size 65536 --minibatch-size 4096 --epochs 2 --repeats 6)
  CNN=(--observations atari --hiddens 512 --batch-size 1024 --minibatch-size 256 --epochs 4 --repeats 6)
fi
run_section "learner_update mlp256" 50 170 "$OUT_DIR/learner_update_mlp256.log" "$PY" "${LU[@]}" "${MLP_SMALL[@]}"
run_section "learner_update mlp1024" 50 120 "$OUT_DIR/learner_update_mlp1024.log" "$PY" "${LU[@]}" "${MLP_LARGE[@]}"
run_section "learner_update cnn" 50 70 "$OUT_DIR/learner_update_cnn.log" "$PY" "${LU[@]}" "${CNN[@]}"

# ---- 5. DQN and SAC, GPU against CPU ----------------------------------------------------
OP_DEVICE=0
"$PY" benchmarks/off_policy.py --help 2>/dev/null | grep -q -- --device && OP_DEVICE=1
# The dry run goes through the pipeline even without --device (both runs on the CPU then).
if [ "$OP_DEVICE" = 1 ] || [ "$DEVICE" = cpu ]; then
  if [ "$DEVICE" = cpu ]; then DQN_STEPS=1300 SAC_STEPS=150; else DQN_STEPS=${GPU_CHECK_DQN_STEPS:-3000} SAC_STEPS=${GPU_CHECK_SAC_STEPS:-1500}; fi
  # The GPU run and the CPU run side by side (1 thread each; 16 cores): the same conditions for both.
  # off_policy ALGO ROLE DEVICE STEPS: ROLE (gpu or cpu) names the files: the dry run's "gpu" run is on the CPU.
  off_policy() {
    local algo=$1 role=$2 device=$3 steps=$4
    shift 4
    local flags=(--algo "$algo" --variants ours --seeds 0 --threads 1 --max-env-steps "$steps" --timeout 150 "$@")
    [ "$OP_DEVICE" = 1 ] && flags+=(--device "$device")
    "$PY" benchmarks/off_policy.py "${flags[@]}" --json "$OUT_DIR/off_policy_${algo}_${role}.json" \
      >"$OUT_DIR/off_policy_${algo}_${role}.log" 2>&1
  }
  off_policy_all() {
    local gpu=cuda
    [ "$DEVICE" = cpu ] && gpu=cpu  # the dry run: the pipeline and the table, not a comparison
    off_policy dqn gpu "$gpu" "$DQN_STEPS" &
    off_policy dqn cpu cpu "$DQN_STEPS" &
    off_policy sac gpu "$gpu" "$SAC_STEPS" &
    off_policy sac cpu cpu "$SAC_STEPS" &
    if [ "$DEVICE" != cpu ]; then  # the example configs with cuda_graphs: true, on the GPU
      for algo in dqn sac; do
        "$PY" - "$algo" "$OUT_DIR/${algo}_cuda_graphs.yaml" <<'PYEOF'
import sys, yaml
algo, target = sys.argv[1], sys.argv[2]
config = yaml.safe_load(open(f"examples/{'dqn_cartpole' if algo == 'dqn' else 'sac_pendulum'}.yaml"))
config["model"].setdefault("init_args", {})["cuda_graphs"] = True
yaml.safe_dump(config, open(target, "w"))
PYEOF
      done
      off_policy dqn graphs cuda "$DQN_STEPS" --dqn-config "$OUT_DIR/dqn_cuda_graphs.yaml" &
      off_policy sac graphs cuda "$SAC_STEPS" --sac-config "$OUT_DIR/sac_cuda_graphs.yaml" &
    fi
    wait
  }
  export -f off_policy off_policy_all
  export PY OUT_DIR DEVICE DQN_STEPS SAC_STEPS OP_DEVICE
  run_section "off_policy" "${GPU_CHECK_OFF_POLICY_S:-70}" 0 "$OUT_DIR/off_policy.log" bash -c off_policy_all
else
  echo "[off_policy] no --device in this version: DQN and SAC on the GPU are left out"
  echo "benchmarks/off_policy.py has no --device" >"$OUT_DIR/off_policy.log"
  printf '%s\t%s\t%s\t%s\n' off_policy 126 0 "$OUT_DIR/off_policy.log" >>"$SECTIONS"
fi

# ---- 6. the table -----------------------------------------------------------------------
echo
echo "== gpu_check: done in $(elapsed)s (device=$DEVICE)"
GPU_CHECK_DEVICE=$DEVICE "$PY" benchmarks/_gpu_table.py "$OUT_DIR" | tee "$OUT_DIR/table.md"
