#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs clang-tidy (.clang-tidy) over the library's and the program's C++ sources with the
# compile commands of the build folder given (default: build); fails on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/compile_commands.json" ] || { echo "no $build/compile_commands.json: configure first"; exit 2; }
mapfile -t files < <(git ls-files 'src/*.cpp' 'tools/*.cpp')
run-clang-tidy -quiet -p "$build" -j "$(nproc)" "${files[@]}" >"$build/clang-tidy.log" 2>&1 || {
  sed 's/\x1b\[[0-9;]*m//g' "$build/clang-tidy.log" | grep -E "(error|warning): " | sort -u
  echo "clang-tidy: findings above (full log: $build/clang-tidy.log)"
  exit 1
}
echo "clang-tidy: ${#files[@]} files, no findings"
