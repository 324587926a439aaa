#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fails when a tracked C++/CUDA file is not formatted as .clang-format says. Fix with
#   git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.c' '*.h' | xargs clang-format -i
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.c' '*.h' | xargs clang-format --dry-run --Werror
echo "format: clean"
