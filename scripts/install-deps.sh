#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian/Ubuntu packages tpcomm builds with, skipping those already present.
# The CUDA toolkit (nvcc, cuda.h, nccl.h) is not a Debian package of the needed version: it must
# already be installed (CUDA 12.8 or newer; NCCL's header ships with it or with libnccl-dev).
set -euo pipefail
# With --checks, also the tools .ci/run checks the tree with (clang-format, clang-tidy) and
# matplotlib, which the test of scripts/plot.py needs (it is skipped without).
# python3-pytest runs the Python package's tests; python3-venv and python3-pip install it.
packages=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev libbenchmark-dev
          python3 python3-pytest python3-venv python3-pip)
[ "${1:-}" = "--checks" ] && packages+=(clang-format clang-tidy clang python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "note: no nvcc found; only the host library and the cpu tests will build" >&2
fi
