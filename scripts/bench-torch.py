#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tpcomm from PyTorch against tpcomm from C++, in one run, on a GPU machine:

1. graph-replayed `tpcomm::all_reduce` (the PyTorch op, N calls captured in one CUDA graph)
   under torchrun, against `tpcomm bench --graph` started by `tpcomm launch` with the same
   number of processes, sizes, iterations and replays (the median per operation of each);
2. the eager call's host overhead at world size 1: `torch.ops.tpcomm.all_reduce`, the ctypes
   call below it (`tpcomm.Group.all_reduce`), and `torch.distributed.all_reduce` (NCCL).

    python3 scripts/bench-torch.py --np 2 --tpcomm build/bin/tpcomm [--json OUT.json]

Needs torch with CUDA and the tpcomm package (`pip install .`, or PYTHONPATH=python with
TPCOMM_LIBRARY=build/lib/libtpcomm.so).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def sizes_of(args):
    sizes, s = [], parse_size(args.begin)
    while s <= parse_size(args.end):
        sizes.append(s)
        s *= args.factor
    return sizes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- workers (run by this script) -------------------------------------------------------------


def worker_graph(args):
    """Under torchrun: the median time per graph-replayed `tpcomm::all_reduce`, per size."""
    import torch

    from tpcomm.torch import TpcommGroup

    group = TpcommGroup()
    dtype = getattr(torch, args.dtype)
    esize = torch.empty(0, dtype=dtype).element_size()
    results = {}
    for size in sizes_of(args):
        x = torch.ones(size // esize, dtype=dtype, device=group.device)
        for _ in range(args.warmup):
            group.all_reduce(x)
        torch.cuda.synchronize()
        group.bootstrap.barrier()
        graph = torch.cuda.CUDAGraph()
        with group.graph_capture() as stream:
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                for _ in range(args.iters):
                    group.all_reduce(x)
        # One replay first: the first launch of a graph uploads it.
        group.bootstrap.barrier()
        graph.replay()
        torch.cuda.synchronize()
        times = []
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(args.replays):
            group.bootstrap.barrier()
            start.record()
            graph.replay()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1000 / args.iters)
        results[size] = statistics.median(times)
        del graph
    group.bootstrap.barrier()
    if group.rank_in_group == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    group.close()


def worker_overhead(args):
    """World size 1: host time per eager call, averaged over many calls."""
    import torch
    import torch.distributed as dist

    import tpcomm
    from tpcomm.torch import TpcommGroup, _desc

    torch.cuda.set_device(0)
    group = TpcommGroup(device=0, bootstrap=tpcomm.Bootstrap(rank=0, world_size=1))
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    x = torch.ones(512, dtype=torch.bfloat16, device="cuda")  # 1 KiB
    out = torch.empty_like(x)
    stream = torch.cuda.current_stream().cuda_stream
    dx, dout = _desc(x), _desc(out)
    calls = {
        "torch.ops.tpcomm.all_reduce": lambda: torch.ops.tpcomm.all_reduce(x, group.handle, "sum"),
        "tpcomm.Group.all_reduce (ctypes)": lambda: group.group.all_reduce(dx, dout, "sum", stream),
        "torch.distributed.all_reduce (NCCL)": lambda: dist.all_reduce(x),
    }
    from tpcomm.torch import compiled
    if compiled():  # python/torch_ext is installed: the compiled eager path too
        calls["torch.ops.tpcomm_c.all_reduce (compiled)"] = (
            lambda: torch.ops.tpcomm_c.all_reduce(x, group.c_handle, "sum"))
        calls["TpcommGroup.all_reduce (compiled)"] = lambda: group.all_reduce(x)
        calls["TpcommGroup.all_reduce_ (compiled, in place)"] = lambda: group.all_reduce_(x)
    results = {}
    for name, call in calls.items():
        for _ in range(100):
            call()
        torch.cuda.synchronize()
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                call()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            samples.append((t1 - t0) * 1e6 / args.calls)
        results[name] = min(samples)
    dist.destroy_process_group()
    group.close()
    with open(args.out, "w") as f:
        json.dump(results, f)


# ---- the driver -------------------------------------------------------------------------------


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2, help="processes (ranks) of the graph comparison")
    p.add_argument("--tpcomm", default="build/bin/tpcomm", help="the tpcomm program")
    p.add_argument("-b", "--begin", default="1K")
    p.add_argument("-e", "--end", default="1M")
    p.add_argument("-f", "--factor", type=int, default=4)
    p.add_argument("-d", "--dtype", default="bfloat16")
    p.add_argument("-n", "--iters", type=int, default=20, help="operations per graph")
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--calls", type=int, default=2000, help="eager calls per overhead sample")
    p.add_argument("--json", help="write every number to this file")
    p.add_argument("--worker", choices=["graph", "overhead"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "graph":
        return worker_graph(args)
    if args.worker == "overhead":
        return worker_overhead(args)

    me = os.path.abspath(__file__)
    common = ["-b", args.begin, "-e", args.end, "-f", str(args.factor), "-d", args.dtype,
              "-n", str(args.iters), "-w", str(args.warmup), "--replays", str(args.replays)]
    with tempfile.TemporaryDirectory() as tmp:
        py_json, cpp_json, ov_json = (os.path.join(tmp, n) for n in ("py", "cpp", "ov"))
        run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.np),
             "--master-port", str(free_port()), me, "--worker", "graph", "--out", py_json]
            + common)
        run([args.tpcomm, "launch", "-n", str(args.np), "--", args.tpcomm, "bench", "-b",
             args.begin, "-e", args.end, "-f", str(args.factor), "-d", args.dtype, "--graph",
             "-n", str(args.iters), "-w", str(args.warmup), "--graph-replays", str(args.replays),
             "--algo", "auto", "--json", cpp_json])
        run([sys.executable, me, "--worker", "overhead", "--out", ov_json, "--calls",
             str(args.calls)])
        with open(py_json) as f:
            py = {int(k): v for k, v in json.load(f).items()}
        with open(cpp_json) as f:
            cpp = {row["size"]: row["out_of_place"].get("time_us")
                   for row in json.load(f)["rows"]}
        with open(ov_json) as f:
            overhead = json.load(f)

    print(f"\ngraph-replayed all-reduce, {args.np} processes, {args.dtype}, {args.iters} "
          f"operations per graph, median of {args.replays} replays (us per operation)")
    print(f"{'bytes':>10}  {'torch op':>10}  {'tpcomm bench':>12}  {'ratio':>6}")
    for size in sizes_of(args):
        a, b = py.get(size), cpp.get(size)
        ratio = f"{a / b:6.2f}" if a and b else "     -"
        fa = f"{a:10.2f}" if a is not None else f"{'-':>10}"
        fb = f"{b:12.2f}" if b is not None else f"{'-':>12}"
        print(f"{size:>10}  {fa}  {fb}  {ratio}")
    print("\neager call, host time per call at world size 1, 1 KiB bf16 (us)")
    for name, us in overhead.items():
        print(f"  {name:<40} {us:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"graph": {"torch_op_us": py, "tpcomm_bench_us": cpp},
                       "eager_overhead_us": overhead, "np": args.np, "dtype": args.dtype}, f,
                      indent=2)


if __name__ == "__main__":
    main()
