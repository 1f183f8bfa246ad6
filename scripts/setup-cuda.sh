#!/usr/bin/env bash
# Install the pinned CUDA compiler (nvcc 13.0 from PyPI) into `.cuda/` at the
# repository root, so kestrel-kernels can build its kernels without a system
# CUDA toolkit. Idempotent: does nothing when the pinned nvcc is already there.
#
# The five parts are pinned together: installing nvcc alone pulls mismatched
# newer parts, and 13.0 keeps PTX loadable by 580-series drivers.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.cuda"
python="${PYTHON:-python3}"

packages=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
)

find_nvcc() {
  [[ -d "$venv" ]] || return 0
  find "$venv" -path '*/nvidia/cu13/bin/nvcc' -type f 2>/dev/null | head -n 1 || true
}

nvcc="$(find_nvcc)"
if [[ -n "$nvcc" ]] && "$nvcc" --version 2>/dev/null | grep -q 'release 13.0'; then
  echo "nvcc already installed: $nvcc"
  exit 0
fi

echo "installing nvcc 13.0 into $venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}"

nvcc="$(find_nvcc)"
if [[ -z "$nvcc" ]]; then
  echo "error: nvcc not found under $venv after installing" >&2
  exit 1
fi
chmod +x "$nvcc"
"$nvcc" --version | tail -n 2
echo "nvcc installed: $nvcc"
echo "kestrel-kernels finds it there automatically (or set KESTREL_NVCC=$nvcc)"
