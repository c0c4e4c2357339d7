#!/usr/bin/env bash
# Downloads into .whl/ (at the repo root) the wheels that benchmarks/gpu_check.sh installs on the
# GPU machine, which has no network and lacks them: gymnasium, jsonargparse (Lightning's CLI) and
# the env packages of the example configs. Run it here, from the repo root, before the GPU run;
# .whl/ is left out of git (.git/info/exclude) and travels with the working tree.
#
# Only what the GPU lane needs, at the versions of this machine's environment, for CPython 3.12
# on x86_64 Linux; the machine's own torch, lightning, numpy, onnx, h5py, pyyaml, rich are used.
# Left out on purpose (size, <= 64 MiB travels): mujoco-studio (the viewer) and PyOpenGL
# (rendering), scipy/matplotlib/seaborn (MinAtar imports them only to render, with a warning).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
mkdir -p "$DEST"
WHEELS=(
  gymnasium==1.4.0 Farama-Notifications==0.0.6 cloudpickle==2.1.0           # lightning_rl's own deps
  jsonargparse==4.53.0 docstring_parser==0.18.0 typeshed_client==2.15.0      # jsonargparse[signatures]
  minari==0.5.4                                                               # offline examples
  pettingzoo==1.27.0 mpe2==1.1.1 pygame-ce==2.5.8                             # multi-agent examples
  Box2D==2.3.10                                                               # LunarLander
  mujoco==4.0.0 mujoco-core==4.0.0 glfw==2.11.0 imageio==2.38.1              # Hopper, HalfCheetah
  MinAtar==1.0.15 popgym==1.0.7                                               # MinAtar Breakout, POPGym
  pytest-xdist==3.8.0 execnet==2.1.2                                          # the lane's -n workers
)
for spec in "${WHEELS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "$spec" 2>&1 | grep -v "is ignored" || true
done
count=$(ls "$DEST"/*.whl | wc -l)
if [ "$count" -lt "${#WHEELS[@]}" ]; then
  echo "gpu_wheels.sh: only $count of ${#WHEELS[@]} wheels in $DEST" >&2
  exit 1
fi
du -sh "$DEST"
