#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the gpu and mgpu test tiers and the benchmarks on a GPU machine, writing every log under
# the folder given as the first argument. Uses the build in ./build (configure and build it
# first, or carry it from a machine with the same CUDA toolkit).
#
#   scripts/gpu-run.sh OUTDIR [all|tests|gpu|faults|bench|overhead|fused|moe|exchange|step|python|audit|fastest]
#
# `gpu` runs the gpu tier, its first-launch repeats and the mgpu tier alone (`tests` is those, the
# fault matrix and the launcher and C API checks).
#
# `python` installs the Python package (`pip install --no-build-isolation .`, or the wheel that
# TPCOMM_WHEEL names: into python3's own virtualenv where it is one and has torch, pytest and
# scikit-build-core, else into a venv that sees the system's packages, or with --user) and runs
# its tests: the C API from C and Python, the PyTorch ops (opcheck, torch.compile, CUDA graphs),
# the engine adapters, the tensor-parallel MLP under torchrun, and scripts/bench-torch.py.
#
# `audit` runs `tpcomm bench --audit` over every operation and the presets' decode shapes at 2, 4
# and 8 virtual ranks, hot and --cold, most important first (about 8 minutes: the runs left once
# AUDIT_BUDGET_S seconds, default 480, are spent are skipped; each run is stopped after
# STEP_TIMEOUT, here 120 by default), then plots each operation's audit (OUTDIR/audit-*.png) and
# lists every loss in OUTDIR/audit-summary.txt.
#
# `fastest` runs every preset's decode step on 8 virtual ranks at 1 and 128 tokens with
# `tpcomm step --fastest`: each part of the step alone on every path the group can take, then the
# step with each part on its fastest, against the built-in choice (OUTDIR/fastest-<model>.json).
#
# Every step is stopped after STEP_TIMEOUT seconds (default 600); rc=124 in the summary says so.
# The summary is printed last; each step's log is OUTDIR/<step>.txt.
set -u -o pipefail
out=${1:?usage: scripts/gpu-run.sh OUTDIR [all|tests|gpu|faults|bench|overhead|fused|moe|exchange|step|python|audit|fastest]}
what=${2:-all}
mkdir -p "$out"
cd "$(dirname "$0")/.."
bin=build/bin
[ -x "$bin/tpcomm" ] || { echo "no build in ./build: run 'cmake --workflow --preset release' first"; exit 2; }

# House rules of the shared machines: no NVLink multicast.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
summary=()
step() {  # step NAME COMMAND...: runs (at most STEP_TIMEOUT seconds), logs, records pass/fail
  local name=$1; shift
  local start=$SECONDS
  echo "== $name: $*" | tee -a "$out/$name.txt"
  timeout -k 10 "${STEP_TIMEOUT:-600}" "$@" >>"$out/$name.txt" 2>&1
  local rc=$?
  summary+=("$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - start)))")
  return 0
}

# Faults: the kill and stop matrix (graph replays in every failure mode; the all-reduce, the fused
# norm, the all-gather and the all-to-all), mismatched calls across processes, and the gpu tier's
# fault tests.
faults() {
  ulimit -c 0  # the teardown cases end with SIGABRT
  step mgpu-mismatch "$bin/tpcomm" launch -n 2 --timeout 300 -- "$bin/tpcomm_mgpu_tests" \
    --gtest_filter='*Mismatched*'
  local kill victim algo mode handling sig op
  # victim:algorithm:mode:failure mode:signal:operation (all_reduce, fused, all_gather,
  # all_to_all, lm_head, moe_finalize; empty: all_reduce).
  for kill in 1:lamport 0:two_shot 1:one_shot:pdl0 1:lamport:graph:raise 0:one_shot:graph:raise \
      1:lamport:graph:callback 1:two_shot:graph:callback 1:lamport_two_shot:graph:teardown \
      1:lamport:graph:callback:STOP 1:one_shot:eager:raise:STOP \
      1:auto:graph:callback::fused 0:auto:graph:raise::fused 1:auto:graph:teardown::fused \
      1:auto:graph:callback:STOP:fused 1:auto:eager:raise::fused \
      1:auto:graph:callback::all_gather 0:auto:graph:raise::all_gather \
      1:auto:graph:callback:STOP:all_gather 1:auto:eager:raise::all_gather \
      1:auto:graph:callback::all_to_all 1:auto:graph:teardown::all_to_all \
      1:auto:graph:callback:STOP:all_to_all 0:auto:eager:raise::all_to_all \
      1:auto:graph:callback::lm_head 0:auto:graph:raise::lm_head 1:auto:graph:teardown::lm_head \
      1:auto:graph:callback:STOP:lm_head 1:auto:eager:raise::lm_head \
      1:auto:graph:callback::moe_finalize 0:auto:graph:raise::moe_finalize \
      1:auto:graph:teardown::moe_finalize 1:auto:graph:callback:STOP:moe_finalize \
      1:auto:eager:raise::moe_finalize; do
    IFS=: read -r victim algo mode handling sig op <<<"$kill"
    kill_env=(TPCOMM_PDL=1 TPCOMM_ASYNC_ERROR_HANDLING="${handling:-raise}" TPCOMM_MGPU_KILL_OP="${op:-all_reduce}")
    [ "$mode" = pdl0 ] && kill_env=(TPCOMM_PDL=0)
    [ "$mode" = graph ] && kill_env+=(TPCOMM_MGPU_KILL_GRAPH=1)
    [ -n "$sig" ] && kill_env+=(TPCOMM_MGPU_KILL_SIGNAL="$sig")
    step "kill-rank$victim-$algo${mode:+-$mode}${handling:+-$handling}${sig:+-$sig}${op:+-$op}" \
      env "${kill_env[@]}" bash -c '
      port=$((20000 + RANDOM % 20000)); pids=()
      timeout_ms=30000; [ -n "$4" ] && timeout_ms=2000
      for r in 0 1; do
        env TPCOMM_RANK=$r TPCOMM_WORLD_SIZE=2 TPCOMM_LOCAL_RANK=$r TPCOMM_LOCAL_WORLD_SIZE=2 \
          TPCOMM_STORE_ADDR=127.0.0.1:$port TPCOMM_TIMEOUT_MS=$timeout_ms \
          TPCOMM_MGPU_KILL=$2 TPCOMM_MGPU_KILL_ALGO=$3 "$1" --gtest_filter="*RankKilled*" &
        pids+=($!)
      done
      survivor=$((1 - $2)); rc=0
      wait "${pids[$survivor]}"; got=$?
      want=0; [ "$TPCOMM_ASYNC_ERROR_HANDLING" = teardown ] && want=134
      echo "rank $survivor (survivor) exited $got (expected $want)"; [ "$got" = "$want" ] || rc=1
      [ -n "$4" ] && kill -KILL "${pids[$2]}"
      wait "${pids[$2]}"; got=$?
      echo "rank $2 (victim) exited $got (expected 137)"; [ "$got" = 137 ] || rc=1
      exit $rc' _ "$bin/tpcomm_mgpu_tests" "$victim" "$algo" "$sig"
  done
}

{ nvidia-smi; nvidia-smi topo -m; } >"$out/info.txt" 2>&1
step info "$bin/tpcomm" info

if [ "$what" = all ] || [ "$what" = tests ] || [ "$what" = gpu ]; then
  step gpu "$bin/tpcomm_gpu_tests"
  # Ranks sharing a process with the caller's kernels between collectives, ten times in a row
  # (docs/FIRST-LAUNCH.md).
  step first-launch "$bin/tpcomm_gpu_tests" --gtest_filter='*CallerKernels*:*LibraryKernels*' \
    --gtest_repeat=10 --gtest_brief=1
  # One process per GPU where there are several; on one GPU, 2 and 4 processes share it.
  if [ "$gpus" -ge 2 ]; then nps="$gpus"; else nps="2 4"; fi
  for np in $nps; do
    step mgpu "$bin/tpcomm" launch -n "$np" --timeout 600 -- "$bin/tpcomm_mgpu_tests"
  done
fi

if [ "$what" = all ] || [ "$what" = tests ]; then
  # A dead peer with the rank watch off: the deadlines notice it.
  step mgpu env TPCOMM_MGPU_DEAD_PEER=1 TPCOMM_TIMEOUT_MS=5000 TPCOMM_RANK_WATCH=0 "$bin/tpcomm" launch \
    -n 2 --timeout 300 -- "$bin/tpcomm_mgpu_tests" --gtest_filter='*DeadPeer*'
  # A rank killed with SIGKILL, the store's host among them, at the default deadline: the rank
  # watch notices it. Two ranks started by hand (a launcher would stop the survivor); the victim
  # ends with 137, the survivor must pass. Graph replays: the survivor never asks the group
  # anything, its watchdog acts by itself in each failure mode (teardown: the survivor ends with
  # SIGABRT, 134); STOP stops the victim instead, noticed at a 2 s deadline (the script then
  # kills it).
  faults
fi

if [ "$what" = faults ]; then
  step faults-gpu "$bin/tpcomm_gpu_tests" --gtest_filter='*Fault*'
  faults
fi

if [ "$what" = overhead ]; then
  # What the fault checks cost where nothing is wrong: graph-replayed latency of every custom
  # algorithm, the fused operation and the exchange, this build against the one in $BASE (the
  # commit before them), alternating, twice each.
  base=${BASE:-build-base}/bin/tpcomm
  for r in 2 4 8; do
    for rep in 1 2; do
      for b in "$base" "$bin/tpcomm"; do
        step overhead "$b" bench --virtual-ranks "$r" -b 1K -e 1M -f 4 -d bfloat16 --graph -n 50 \
          -w 5 --graph-replays 20 --algo lamport,lamport_two_shot,one_shot,two_shot,auto
        step overhead "$b" bench --virtual-ranks "$r" --op allreduce_add_rmsnorm --hidden 7168 \
          -b 14336 -e 917504 -f 4 -d bfloat16 --graph -n 50 -w 5 --graph-replays 20 --algo auto
        step overhead "$b" bench --virtual-ranks "$r" --op allgather -b 1K -e 1M -f 16 \
          -d bfloat16 --graph -n 50 -w 5 --graph-replays 20 --algo pull
        step overhead "$b" bench --virtual-ranks "$r" --op lm_head_exchange --vocab 129280 \
          --tokens 1 -d bfloat16 --graph -n 50 -w 5 --graph-replays 20 --algo auto
      done
    done
  done
fi

if [ "$what" = all ] || [ "$what" = tests ]; then
  # A rank that never starts: the other's setup fails at its deadline, naming it (expected rc 1).
  step never-starts env TPCOMM_RANK=0 TPCOMM_WORLD_SIZE=2 TPCOMM_STORE_ADDR=127.0.0.1:29477 \
    TPCOMM_TIMEOUT_MS=3000 bash -c 'time "$1" bench -b 1K -e 1K -n 1 -w 1' _ "$bin/tpcomm"
  # NCCL missing: the groups are built without it, with a log line saying why.
  step nccl-missing env TPCOMM_NCCL_PATH=/nonexistent/libnccl.so.2 "$bin/tpcomm" launch -n 2 \
    --timeout 300 -- "$bin/tpcomm" bench -b 1K -e 4K -f 4 -d bfloat16 -n 3 -w 1 --algo auto
  # The bench with ranks from other launchers, checked (every rank must use rank 0's data).
  step mgpu "$bin/tpcomm" launch -n 2 --timeout 300 -- "$bin/tpcomm" bench -b 1K -e 4K -f 4 \
    -d bfloat16 --graph -n 3 -w 1 --graph-replays 2 --algo lamport,lamport_two_shot,one_shot,two_shot,auto
  if python3 -c 'import torch' 2>/dev/null; then
    step mgpu python3 -m torch.distributed.run --nproc-per-node 2 --no-python "$bin/tpcomm" bench \
      -b 1K -e 4K -f 4 -d bfloat16 --graph -n 3 -w 1 --graph-replays 2 --algo lamport,one_shot,auto
  fi
fi

if { [ "$what" = all ] || [ "$what" = bench ]; } && [ "$gpus" -ge 2 ]; then
  # Several GPUs over NVLink: one process per GPU, every algorithm against NCCL called directly,
  # graph-replayed, 1 KiB to 256 MiB (the custom kernels up to TPCOMM_CUSTOM_AR_MAX_BYTES).
  step bench "$bin/tpcomm" bench -g "$gpus" -b 1K -e 256M -f 2 -d bfloat16 --graph -n 50 -w 5 \
    --graph-replays 20 --algo lamport,lamport_two_shot,one_shot,two_shot,auto,nccl,nccl_direct \
    --json "$out/bench-g$gpus.json"
  step tune env TPCOMM_TUNE_FILE="/tmp/tpcomm-tune-g$gpus.txt" "$bin/tpcomm" tune -g "$gpus"
  # The tuned table in use: auto again, now reading the table tune just wrote.
  step bench env TPCOMM_TUNE_FILE="/tmp/tpcomm-tune-g$gpus.txt" "$bin/tpcomm" bench -g "$gpus" \
    -b 1K -e 16M -f 2 -d bfloat16 --graph -n 50 -w 5 --graph-replays 20 --algo auto,nccl_direct
fi

if [ "$what" = all ] || [ "$what" = bench ]; then
  # Small messages: graph-replayed latency at 2, 4 and 8 virtual ranks.
  for r in 2 4 8; do
    step bench "$bin/tpcomm" bench --virtual-ranks "$r" -b 1K -e 8M -f 2 -d bfloat16 --graph \
      -n 50 -w 5 --graph-replays 20 --algo one_shot,two_shot,lamport,lamport_two_shot,auto,memcpy
  done
  # Large messages far beyond the 60 MB L2: throughput against the device copy.
  step bench env TPCOMM_CUSTOM_AR_MAX_BYTES=512M "$bin/tpcomm" bench --virtual-ranks 8 -b 64M -e 512M -f 2 \
    -d bfloat16 -n 5 -w 2 --algo one_shot,two_shot,memcpy
  # tpcomm's NCCL path against NCCL called directly, world size 1 (eager and graph).
  step bench "$bin/tpcomm" bench -b 4 -e 64M -f 8 -d float -n 200 -w 20 --algo nccl,nccl_direct
  step bench "$bin/tpcomm" bench -b 4 -e 64M -f 8 -d float -n 50 --graph --graph-replays 20 --algo nccl,nccl_direct
  for r in 2 4 8; do
    step tune env TPCOMM_TUNE_FILE="/tmp/tpcomm-tune-w$r.txt" "$bin/tpcomm" tune --virtual-ranks "$r"
  done
  # The peers in PyTorch (NCCL; symmetric-memory one-shot and two-shot), where torch is installed.
  if python3 -c 'import torch' 2>/dev/null; then
    step peers python3 -m torch.distributed.run --nproc-per-node "$gpus" scripts/torch-peers.py \
      -b 1K -e 256M -f 4
  fi
fi

if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = fused ]; then
  # The fused all-reduce + residual add + RMSNorm against the all-reduce followed by add_rmsnorm
  # and the plain all-reduce of the same bytes, tokens 1..2048, workspaces that hold them all;
  # with BASE set, the build there too (its logs and JSON named fused-base).
  for b in ${BASE:+"$BASE/bin/tpcomm"} "$bin/tpcomm"; do
    name=fused; [ "$b" = "$bin/tpcomm" ] || name=fused-base
    for h in 4096 7168; do
      for r in 2 4 8; do
        step "$name" env TPCOMM_LAMPORT_MAX_BYTES=32M TPCOMM_CUSTOM_AR_MAX_BYTES=32M "$b" bench \
          --virtual-ranks "$r" --op allreduce_add_rmsnorm --hidden "$h" -b $((h * 2)) \
          -e $((h * 2 * 2048)) -f 2 -d bfloat16 --graph -n 20 -w 3 --graph-replays 10 \
          --algo auto,lamport,lamport_two_shot,unfused,allreduce --json "$out/$name-h$h-w$r.json"
      done
    done
  done
  # The tuner's fused buckets (the `fused` lines of the table it prints).
  step tune-fused env TPCOMM_TUNE_FILE=/tmp/tpcomm-tune-fused-w4.txt "$bin/tpcomm" tune --virtual-ranks 4
fi

if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = moe ]; then
  # The MoE finalize (the combine of DeepSeek-V3's top-8 and its shared expert, then the fused
  # all-reduce + norm) against the unfused chain (the combine, the all-reduce, add_rmsnorm) and
  # the plain all-reduce of x, tokens 1..128. With BASE set (as for `overhead`), the build there
  # runs each command first, alternating with this one.
  builds=(${BASE:+"$BASE/bin/tpcomm"} "$bin/tpcomm")
  for r in 2 4 8; do
    for b in "${builds[@]}"; do
      tag=-base; [ "$b" = "$bin/tpcomm" ] && tag=
      step moe "$b" bench --virtual-ranks "$r" --op moe_finalize --hidden 7168 --top-k 8 \
        --shared-expert -b 14336 -e $((14336 * 128)) -f 2 -d bfloat16 --graph -n 20 -w 3 \
        --graph-replays 10 --algo auto,unfused,allreduce --json "$out/moe-h7168-w$r$tag.json"
    done
  done
  # The MoE presets' decode step at 8 ranks with the combine in the fused call and apart from it.
  for model in deepseek-v3 qwen3-235b-a22b; do
    for b in "${builds[@]}"; do
      tag=-base; [ "$b" = "$bin/tpcomm" ] && tag=
      for combine in fused separate; do
        step moe "$b" step --model "$model" --tp 8 --virtual-ranks 8 --tokens 1,128 \
          --moe-combine "$combine" --json "$out/step-$model-vr8-$combine$tag.json"
      done
    done
  done
fi

if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = exchange ]; then
  # The LM head's exchange in both forms against SGLang's path (tpcomm's all-gather, then the
  # reassembly copy) and a device copy of the same bytes, for DeepSeek-V3/V4's and Llama 3's
  # vocabularies.
  for vocab in 129280 128256; do
    for r in 2 4 8; do
      step exchange "$bin/tpcomm" bench --virtual-ranks "$r" --op lm_head_exchange --vocab "$vocab" \
        --tokens 1,4,36,120 -d bfloat16 --graph -n 20 -w 3 --graph-replays 10 \
        --algo auto,pull,push,all_gather,memcpy --json "$out/lm-head-v$vocab-w$r.json"
    done
  done
  # The plain exchanges in both forms, 1 KiB to 1 MiB of input per rank, against the device copy
  # and the all-reduce of the same input bytes per rank (an all-gather's or a gather's size is
  # its output's).
  for r in 2 4 8; do
    step exchange "$bin/tpcomm" bench --virtual-ranks "$r" --op allgather -b $((r * 1024)) \
      -e $((r << 20)) -f 4 -d bfloat16 --graph -n 20 -w 3 --graph-replays 10 \
      --algo auto,pull,push,memcpy --json "$out/allgather-w$r.json"
    step exchange "$bin/tpcomm" bench --virtual-ranks "$r" --op gather -b $((r * 1024)) \
      -e $((r << 20)) -f 4 -d bfloat16 --graph -n 20 -w 3 --graph-replays 10 \
      --algo auto,pull,push,memcpy --json "$out/gather-w$r.json"
    step exchange "$bin/tpcomm" bench --virtual-ranks "$r" --op alltoall -b 1K -e 1M -f 4 \
      -d bfloat16 --graph -n 20 -w 3 --graph-replays 10 --algo auto,pull,push,memcpy \
      --json "$out/alltoall-w$r.json"
    step exchange "$bin/tpcomm" bench --virtual-ranks "$r" -b 1K -e 1M -f 4 -d bfloat16 --graph \
      -n 20 -w 3 --graph-replays 10 --algo auto --json "$out/allreduce-w$r.json"
  done
  # The larger sizes the pull form serves, at 8 ranks.
  for op in allgather alltoall; do
    step exchange "$bin/tpcomm" bench --virtual-ranks 8 --op "$op" -b 1M -e 32M -f 4 -d bfloat16 \
      --graph -n 20 -w 3 --graph-replays 10 --algo pull,memcpy --json "$out/$op-w8-large.json"
  done
fi

if [ "$what" = all ] || [ "$what" = tests ] || [ "$what" = python ]; then
  # The C API from C, one process per rank.
  for np in 1 2; do
    step capi "$bin/tpcomm" launch -n "$np" --timeout 300 -- "$bin/tpcomm_capi_gpu_test"
  done
fi

if [ "$what" = python ]; then
  out_abs=$(cd "$out" && pwd)
  py=python3
  pkg=${TPCOMM_WHEEL:-.}
  # Where python3 already has what the build and the tests need (torch, pytest,
  # scikit-build-core), the package goes into it as a user of the machine would install it: into
  # its own virtualenv when it is one (a venv made from a venv would not see that venv's
  # packages), else with --user. Elsewhere a venv that sees the system's packages.
  if python3 -c 'import torch, pytest, scikit_build_core' 2>/dev/null; then
    if python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
      step python-install python3 -m pip install --no-build-isolation --no-deps -v "$pkg"
    else
      step python-install python3 -m pip install --user --no-build-isolation --no-deps -v "$pkg"
    fi
  elif python3 -m venv --system-site-packages "$out_abs/venv" >"$out/venv.txt" 2>&1; then
    py="$out_abs/venv/bin/python"
    step python-install "$py" -m pip install --no-build-isolation --no-deps -v "$pkg"
  else
    step python-install python3 -m pip install --user --no-build-isolation --no-deps -v "$pkg"
  fi
  # The compiled eager path (python/torch_ext), built against this machine's PyTorch with the
  # system's g++ (the GPU machine's CXX names a wrapper that links libstdc++ statically, which
  # setup.py refuses: such a build crashed with SIGSEGV whenever one of its ops raised).
  ext_user=""
  [ "$py" = python3 ] && python3 -c 'import sys; sys.exit(sys.prefix != sys.base_prefix)' &&
    ext_user=--user
  step python-ext env CXX=g++ CC=gcc "$py" -m pip install \
    $ext_user --no-build-isolation --no-deps -v python/torch_ext
  # From the test folder's parent, so that the installed package (not ./python) is imported.
  step python-capi "$py" -m pytest -v -p no:cacheprovider python/tests/test_capi.py
  step python-engines env TPCOMM_REQUIRE_TORCH=1 TPCOMM_REQUIRE_TORCH_EXT=1 \
    "$py" -m pytest -v -p no:cacheprovider python/tests/test_engines.py
  step python-torch "$py" -m pytest -v -p no:cacheprovider python/tests/test_torch_gpu.py
  step python-mlp "$py" -m torch.distributed.run --nproc-per-node 2 python/tests/torchrun_mlp.py
  step python-engines-mlp "$py" -m torch.distributed.run --nproc-per-node 2 \
    python/tests/torchrun_engines.py
  step python-bench "$py" scripts/bench-torch.py --np 2 --tpcomm "$bin/tpcomm" \
    --json "$out_abs/bench-torch.json"
fi

if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = step ]; then
  # Every preset's decode step at 1 and 128 tokens per rank, results checked: tpcomm's paths
  # against the unfused ones (and NCCL, which needs one process per GPU), JSON and PNG per run.
  plot=""
  if python3 -c 'import matplotlib' 2>/dev/null; then plot=yes; else
    echo "note: no matplotlib for python3: JSON only (apt-get install python3-matplotlib)" | tee -a "$out/step.txt"
  fi
  for model in deepseek-v3 llama-3.1-70b qwen3-235b-a22b gpt-oss-120b; do
    for r in 2 4 8; do
      name="step-$model-w$r"
      step step "$bin/tpcomm" step --model "$model" --tp "$r" --virtual-ranks "$r" --tokens 1,128 \
        --json "$out/$name.json" ${plot:+--plot "$out/$name.png"}
    done
    if [ "$gpus" -ge 2 ]; then
      name="step-$model-g$gpus"
      step step "$bin/tpcomm" step --model "$model" --tp "$gpus" -g "$gpus" --tokens 1,128 \
        --json "$out/$name.json" ${plot:+--plot "$out/$name.png"}
    fi
  done
  # With compute between the operations (20 us per GEMM stand-in): launch overlap and PDL as in
  # a real step.
  step step "$bin/tpcomm" step --model deepseek-v3 --tp 8 --virtual-ranks 8 --tokens 1,128 \
    --compute-us 20 --json "$out/step-deepseek-v3-w8-compute20.json" \
    ${plot:+--plot "$out/step-deepseek-v3-w8-compute20.png"}
fi

if [ "$what" = fastest ]; then
  # The built-in step against the step with each part on the fastest path found for it alone.
  for model in deepseek-v3 qwen3-235b-a22b llama-3.1-70b gpt-oss-120b; do
    step fastest "$bin/tpcomm" step --model "$model" --tp 8 --virtual-ranks 8 --tokens 1,128 \
      --fastest --json "$out/fastest-$model.json"
  done
fi

if [ "$what" = audit ]; then
  # The built-in choice audited over the decode shapes (tpcomm bench --audit: every path the group
  # can take, in alternating rounds; a loss is auto slower than the fastest other path by more
  # than max(3%, 0.2 us)): every operation at 8, 4 and 2 virtual ranks, hot and --cold, each run's
  # JSON audit-<run>.json, most important first; once AUDIT_BUDGET_S seconds (default 480) are
  # spent the remaining runs are skipped. Then the plots (audit-<operation>.png) and
  # audit-summary.txt: every loss, and the runs skipped. Sizes: the all-reduce 4 KiB..4 MiB; the
  # fused norm and the MoE finalize 1, 4, 16, 64 and 256 tokens of the presets' hidden sizes; the
  # LM head 1..64 tokens; the exchanges 4 KiB..1 MiB per rank. The fused norm's FP8 forms are not
  # audited: the bench has no flag for them.
  audit_budget=${AUDIT_BUDGET_S:-480}
  audit_start=$SECONDS
  audit_skipped=()
  audit_run() {  # audit_run NAME BENCH-ARGS...: hot, then cold, while the budget lasts
    local name=$1 cold run json
    shift
    for cold in "" --cold; do
      run="audit-$name${cold:+-cold}"
      json="$out/$run.json"
      if [ $((SECONDS - audit_start)) -ge "$audit_budget" ]; then
        audit_skipped+=("$run")
        continue
      fi
      rm -f "$json"
      STEP_TIMEOUT=${STEP_TIMEOUT:-120} step "$run" "$bin/tpcomm" bench "$@" ${cold:+"$cold"} \
        -d bfloat16 --graph -n 10 -w 3 --graph-replays 5 --audit --audit-repeats 2 --json "$json"
    done
  }
  audit_core() {  # the all-reduce and the fused norm at R ranks
    local r=$1 h
    audit_run "allreduce-w$r" --virtual-ranks "$r" -b 4K -e 4M -f 2
    for h in 7168 4096 8192 5120 2880; do
      audit_run "fused-h$h-w$r" --virtual-ranks "$r" --op allreduce_add_rmsnorm \
        --hidden "$h" -b $((h * 2)) -e $((h * 2 * 256)) -f 4
    done
  }
  audit_rest() {  # the MoE finalize of the MoE presets, the LM head and the exchanges at R ranks
    local r=$1 moe h k shared flags vocab op
    # DeepSeek-V3 (top-8 and a shared expert), Qwen3-235B-A22B (top-8), gpt-oss-120b (top-4).
    for moe in 7168:8:true 4096:8:false 2880:4:false; do
      IFS=: read -r h k shared <<<"$moe"
      flags=(--op moe_finalize --hidden "$h" --top-k "$k")
      [ "$shared" = true ] && flags+=(--shared-expert)
      audit_run "moe-h$h-k$k-w$r" --virtual-ranks "$r" "${flags[@]}" \
        -b $((h * 2)) -e $((h * 2 * 256)) -f 4
    done
    for vocab in 129280 201088; do
      audit_run "lm-head-v$vocab-w$r" --virtual-ranks "$r" --op lm_head_exchange \
        --vocab "$vocab" --tokens 1,4,16,64
    done
    for op in allgather gather; do  # sizes are the output's: world x the input
      audit_run "$op-w$r" --virtual-ranks "$r" --op "$op" -b $((r * 4096)) -e $((r << 20)) -f 4
    done
    audit_run "alltoall-w$r" --virtual-ranks "$r" --op alltoall -b 4K -e 1M -f 4
  }
  audit_core 8
  audit_rest 8
  audit_core 4
  audit_core 2
  audit_rest 4
  audit_rest 2
  plot_py=""
  for py in python3 /usr/bin/python3; do
    "$py" -c 'import matplotlib' 2>/dev/null && { plot_py=$py; break; }
  done
  if [ -n "$plot_py" ]; then
    shopt -s nullglob
    for group in allreduce fused moe lm-head exchange; do
      files=("$out/audit-$group"-*.json)
      [ "$group" = exchange ] && files=("$out"/audit-*gather-*.json "$out"/audit-alltoall-*.json)
      [ "${#files[@]}" -gt 0 ] &&
        step audit-plot "$plot_py" scripts/plot.py "${files[@]}" -o "$out/audit-$group.png"
    done
    shopt -u nullglob
  else
    echo "note: no matplotlib for python3: no audit plots (apt-get install python3-matplotlib)"
  fi
  python3 scripts/audit-summary.py "$out"/audit-*.json >"$out/audit-summary.txt" 2>&1
  if [ "${#audit_skipped[@]}" -gt 0 ]; then
    echo "# skipped, the budget of $audit_budget s spent (AUDIT_BUDGET_S):" \
      "${audit_skipped[*]}" >>"$out/audit-summary.txt"
  fi
  cat "$out/audit-summary.txt"
fi

echo "== failures"
grep -h -E "^\[  FAILED  \]|^FAILED |Failure$|failed:|tpcomm: " "$out"/*.txt | sort -u | head -40
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
