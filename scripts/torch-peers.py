#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The peers tpcomm is measured against, timed the way `tpcomm bench --graph` times itself.

PyTorch's NCCL all-reduce and its symmetric-memory one-shot and two-shot all-reduce, bf16, each
captured as a CUDA graph of N operations per rank and replayed; the median over replays, per
operation, is reported by rank 0 in nccl-tests-like rows (and as JSON with --json). Symmetric
memory needs its own buffer, so its rows include the copy of the input into it, as an engine
using it in a graph pays (vLLM and SGLang do the same).

    python3 -m torch.distributed.run --nproc-per-node 8 scripts/torch-peers.py -b 1K -e 256M -f 2

NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NCCL_NVLS_ENABLE=0).
"""
import argparse
import json
import os
import statistics

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse_bytes(text):
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def sizes(args):
    s = args.min_bytes
    while s <= args.max_bytes:
        yield s
        s *= args.factor


def time_graph(fn, iters, replays, stream):
    """Median microseconds per operation over graph replays of `iters` calls of fn."""
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # warm-up, outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(iters):
            fn()
    torch.cuda.synchronize()
    dist.barrier()
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    events[0].record()
    for r in range(replays):
        graph.replay()
        events[r + 1].record()
    torch.cuda.synchronize()
    per_op = [events[r].elapsed_time(events[r + 1]) * 1000.0 / iters for r in range(replays)]
    return statistics.median(per_op)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--min-bytes", type=parse_bytes, default=parse_bytes("1K"))
    p.add_argument("-e", "--max-bytes", type=parse_bytes, default=parse_bytes("256M"))
    p.add_argument("-f", "--factor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=50)
    p.add_argument("--graph-replays", type=int, default=20)
    p.add_argument("--peers", default="nccl,symm_one_shot,symm_two_shot")
    p.add_argument("--json", default="")
    args = p.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    stream = torch.cuda.Stream()
    peers = args.peers.split(",")
    symm = None
    if any(x.startswith("symm") for x in peers):
        import torch.distributed._symmetric_memory as symm_mem

        symm = symm_mem.empty(args.max_bytes // 2, dtype=torch.bfloat16, device="cuda")
        symm_mem.rendezvous(symm, group_name)

    x = torch.randint(-8, 9, (args.max_bytes // 2,), dtype=torch.int32, device="cuda").to(torch.bfloat16)
    rows = []
    if rank == 0:
        print(f"# torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
              f"{world} rank(s), {torch.cuda.get_device_name()}, bf16, CUDA graph of {args.iters} ops, "
              f"median of {args.graph_replays} replays, microseconds per op")
        print("#" + "".join(f"{h:>16}" for h in ["size (B)"] + peers))
    for nbytes in sizes(args):
        n = nbytes // 2
        inp = x[:n]
        row = {"bytes": nbytes}
        for peer in peers:
            if peer == "nccl":
                buf = inp.clone()
                fn = lambda: dist.all_reduce(buf)  # noqa: E731
            elif peer == "symm_one_shot":
                view = symm[:n]

                def fn(view=view, inp=inp):
                    view.copy_(inp)
                    return torch.ops.symm_mem.one_shot_all_reduce(view, "sum", group_name)
            elif peer == "symm_two_shot":
                view = symm[:n]

                def fn(view=view, inp=inp):
                    view.copy_(inp)
                    torch.ops.symm_mem.two_shot_all_reduce_(view, "sum", group_name)
            else:
                raise SystemExit(f"unknown peer {peer}")
            try:
                row[peer] = time_graph(fn, args.iters, args.graph_replays, stream)
            except Exception as e:  # a peer that cannot run at this size: say so, go on
                row[peer] = None
                if rank == 0:
                    print(f"# {peer} at {nbytes} B: {type(e).__name__}: {str(e).splitlines()[0]}")
        rows.append(row)
        if rank == 0:
            cells = [f"{row[p]:16.2f}" if row[p] is not None else f"{'-':>16}" for p in peers]
            print(f"{nbytes:>17}" + "".join(cells), flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "torch-peers", "world_size": world, "torch": torch.__version__,
                       "rows": rows}, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
