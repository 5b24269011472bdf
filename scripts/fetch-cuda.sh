#!/usr/bin/env bash
# Installs the pinned NVIDIA user-space pieces the tests run on top of simgpu.
# Everything lands under $LIBSHARE_CACHE (default ~/.cache/libshare); pip's own
# download cache (~/.cache/pip) makes a second run offline-fast. Idempotent.
set -euo pipefail
CACHE="${LIBSHARE_CACHE:-$HOME/.cache/libshare}"
CU12_VER=12.9.79        # nvidia-cuda-runtime-cu12
CU13_VER=13.5.37        # nvidia-cuda-runtime, -nvcc, -nvvm, -crt
TORCH_VER=2.15.0        # torch (PyPI default build, CUDA 13.x)
NVML_PY_VER=13.615.71   # nvidia-ml-py (pynvml)

pip_target() { # dir, packages...
  local dir=$1; shift
  if [ -f "$dir/.done" ] && [ "$(cat "$dir/.done")" = "$*" ]; then return 0; fi
  rm -rf "$dir"; mkdir -p "$dir"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" "$@"
  echo "$*" >"$dir/.done"
}

want=${1:-all}
if [ "$want" = all ] || [ "$want" = cudart ]; then
  pip_target "$CACHE/cu12" "nvidia-cuda-runtime-cu12==$CU12_VER" "nvidia-cuda-nvcc-cu12==12.9.86"
  pip_target "$CACHE/cu13" "nvidia-cuda-runtime==$CU13_VER" "nvidia-cuda-nvcc==$CU13_VER" \
    "nvidia-nvvm==$CU13_VER" "nvidia-cuda-crt==$CU13_VER"
  # nvcc -cudart shared links against libcudart.so
  ln -sf libcudart.so.13 "$CACHE/cu13/nvidia/cu13/lib/libcudart.so"
fi
if [ "$want" = all ] || [ "$want" = torch ]; then
  if [ ! -x "$CACHE/torch-venv/bin/python" ] || ! "$CACHE/torch-venv/bin/python" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VER')" 2>/dev/null; then
    rm -rf "$CACHE/torch-venv"
    python3 -m venv "$CACHE/torch-venv"
    "$CACHE/torch-venv/bin/pip" install --quiet --disable-pip-version-check "torch==$TORCH_VER" "nvidia-ml-py==$NVML_PY_VER" numpy
  fi
fi
echo "$CACHE"
