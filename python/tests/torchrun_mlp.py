# SPDX-License-Identifier: Apache-2.0
"""A two-layer tensor-parallel MLP over tpcomm, one process per rank under torchrun (two
processes may share one GPU: peer memory between processes). Each layer is a column-parallel
up projection, ReLU, a row-parallel down projection and `tpcomm::all_reduce`, plus the residual.
Run eagerly, under `torch.compile(fullgraph=True)` and replayed from a CUDA graph with new data;
every result must equal a single-process reference exactly (small integers: every sum is exact
in fp32) and be bitwise identical on every rank.

    torchrun --nproc-per-node 2 python/tests/torchrun_mlp.py
"""
import hashlib

import torch

from tpcomm.torch import TpcommGroup

HIDDEN, FFN, TOKENS, LAYERS = 32, 64, 8, 2


def main():
    group = TpcommGroup()
    rank, world = group.rank_in_group, group.world_size
    assert FFN % world == 0
    dev = group.device
    # The same full weights on every rank (one seed), each rank keeps its shard.
    gen = torch.Generator().manual_seed(1234)
    full = [(torch.randint(-1, 2, (HIDDEN, FFN), generator=gen).float(),
             torch.randint(-1, 2, (FFN, HIDDEN), generator=gen).float()) for _ in range(LAYERS)]
    shard = FFN // world
    weights = [(up[:, rank * shard:(rank + 1) * shard].contiguous().to(dev),
                down[rank * shard:(rank + 1) * shard, :].contiguous().to(dev))
               for up, down in full]
    h = group.handle

    def tp_mlp(x):
        for up, down in weights:
            x = x + torch.ops.tpcomm.all_reduce(torch.relu(x @ up) @ down, h, "sum")
        return x

    def reference(x):
        x = x.cpu()
        for up, down in full:
            x = x + torch.relu(x @ up) @ down
        return x

    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(-1, 2, (TOKENS, HIDDEN), generator=g).float()

    results = []
    # Eager.
    x = inputs(1)
    results.append(("eager", tp_mlp(x.to(dev)), reference(x)))
    # torch.compile, the op traced into the graph.
    compiled = torch.compile(tp_mlp, fullgraph=True)
    x = inputs(2)
    results.append(("compiled", compiled(x.to(dev)), reference(x)))
    # A CUDA graph, captured once and replayed with new data.
    static_x = inputs(3).to(dev)
    tp_mlp(static_x)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with group.graph_capture() as stream:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            static_y = tp_mlp(static_x)
    for seed in (4, 5):
        x = inputs(seed)
        static_x.copy_(x)
        static_y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        results.append((f"graph replay {seed}", static_y.clone(), reference(x)))

    ok = True
    # SGLang's logits gather: every rank's block of columns of the eager result, to rank 0 only.
    y = results[0][1]
    cols = y.shape[1] // world
    gathered = group.gather(y[:, rank * cols:(rank + 1) * cols].contiguous(), dst=0, dim=-1)
    if rank != 0 and gathered is not None:
        ok = False
        print(f"rank {rank}: gather returned a tensor off the root", flush=True)
    if rank == 0 and not torch.equal(gathered, y[:, :cols * world]):
        ok = False
        print(f"rank {rank}: gather: the columns differ", flush=True)
    for name, got, want in results:
        got = got.cpu()
        if not torch.equal(got, want):
            ok = False
            print(f"rank {rank}: {name}: {int((got != want).sum())} elements differ", flush=True)
        # Bitwise identical on every rank: compare digests through tpcomm's store.
        digest = hashlib.sha256(got.numpy().tobytes()).hexdigest()
        group.bootstrap.store_set(f"mlp/{name}/{rank}", digest)
        group.bootstrap.barrier()
        for peer in range(world):
            if group.bootstrap.store_get(f"mlp/{name}/{peer}").decode() != digest:
                ok = False
                print(f"rank {rank}: {name}: rank {peer}'s result differs", flush=True)
    group.bootstrap.barrier()
    group.close()
    if not ok:
        raise SystemExit(1)
    print(f"rank {rank} of {world}: eager, compiled and graph-replayed MLP matches the "
          "reference, bitwise equal on every rank", flush=True)


if __name__ == "__main__":
    main()
