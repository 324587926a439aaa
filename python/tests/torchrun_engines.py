# SPDX-License-Identifier: Apache-2.0
"""A tensor-parallel MLP through the engine adapters (`tpcomm.engines`), one process per rank
under torchrun, the ranks taken from torch.distributed's own store: SGLang's convention (the
all-reduce, then a sequence-parallel layer: reduce_scatter_tensor and all_gather_into_tensor)
and vLLM's (the all-reduce, then reduce_scatter along the tokens and all_gather back). Run
eagerly, under `torch.compile(fullgraph=True)` and replayed from CUDA graphs captured in the
adapters' capture contexts (SGLang's nested); every result must equal a one-process reference
exactly (small integers) and be bitwise equal on every rank.

    torchrun --nproc-per-node 2 python/tests/torchrun_engines.py
"""
import hashlib

import torch
import torch.distributed as dist

from tpcomm.engines import SglangCommunicator, VllmCommunicator

HIDDEN, FFN, TOKENS = 32, 64, 8


def model(comm, kind, weights):
    (up1, down1), (up2, down2) = weights
    world = comm.world_size

    def forward(x):
        x = x + comm.all_reduce(torch.relu(x @ up1) @ down1)
        partial = torch.relu(x @ up2) @ down2  # this rank's share of the second layer
        if kind == "sglang":
            mine = partial.new_empty(TOKENS // world, HIDDEN)
            comm.reduce_scatter_tensor(mine, partial)
            full = partial.new_empty(TOKENS, HIDDEN)
            comm.all_gather_into_tensor(full, mine)
        else:
            full = comm.all_gather(comm.reduce_scatter(partial, 0), 0)
        return x + full

    return forward


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert FFN % world == 0 and TOKENS % world == 0
    gen = torch.Generator().manual_seed(1234)
    full = [(torch.randint(-1, 2, (HIDDEN, FFN), generator=gen).float(),
             torch.randint(-1, 2, (FFN, HIDDEN), generator=gen).float()) for _ in range(2)]

    def reference(x):
        for up, down in full:
            x = x + torch.relu(x @ up) @ down
        return x

    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(-1, 2, (TOKENS, HIDDEN), generator=g).float()

    ok = True
    for kind, make in (("sglang", SglangCommunicator), ("vllm", VllmCommunicator)):
        comm = make(dist.group.WORLD, unique_name="tp")
        other = make(dist.group.WORLD, unique_name="attn_tp")  # a second group, nested capture
        dev = comm.device
        shard = FFN // world
        weights = [(up[:, rank * shard:(rank + 1) * shard].contiguous().to(dev),
                    down[rank * shard:(rank + 1) * shard, :].contiguous().to(dev))
                   for up, down in full]
        forward = model(comm, kind, weights)
        results = []
        x = inputs(1)
        results.append(("eager", forward(x.to(dev)), reference(x)))
        compiled = torch.compile(forward, fullgraph=True)
        x = inputs(2)
        results.append(("compiled", compiled(x.to(dev)), reference(x)))
        static_x = inputs(3).to(dev)
        forward(static_x)
        other.all_reduce(static_x)  # the second group's first call, outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with comm.graph_capture() as ctx, other.graph_capture(ctx):
            with torch.cuda.graph(graph, stream=ctx.stream, capture_error_mode="thread_local"):
                static_y = forward(static_x)
        for seed in (4, 5):
            x = inputs(seed)
            static_x.copy_(x)
            static_y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            results.append((f"graph replay {seed}", static_y.clone(), reference(x)))
        for name, got, want in results:
            got = got.cpu()
            if not torch.equal(got, want):
                ok = False
                print(f"rank {rank}: {kind} {name}: {int((got != want).sum())} elements differ",
                      flush=True)
            digests = [None] * world
            dist.all_gather_object(digests, hashlib.sha256(got.numpy().tobytes()).hexdigest())
            if len(set(digests)) != 1:
                ok = False
                print(f"rank {rank}: {kind} {name}: the ranks' results differ", flush=True)
        comm.barrier()
        other.destroy()
        comm.destroy()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)
    print(f"rank {rank} of {world}: the SGLang- and vLLM-shaped MLPs (eager, compiled, graph "
          "replays) match the reference, bitwise equal on every rank", flush=True)


if __name__ == "__main__":
    main()
