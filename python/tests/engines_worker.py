# SPDX-License-Identifier: Apache-2.0
"""One rank of tests/test_engines.py: `engines_worker.py CASES RANK WORLD PORT`. Calls the
adapters exactly as SGLang's and vLLM's code calls their communicators, on the CPU with the
gloo stand-in for the GPU calls, and checks every result against the value computed here from
every rank's inputs (integer-valued, so every sum is exact). Prints "ok N" after N checks."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engines_standin import GlooNative  # noqa: E402

import tpcomm  # noqa: E402
from tpcomm.engines import GraphCaptureContext, SglangCommunicator, VllmCommunicator  # noqa: E402
from tpcomm.torch import bootstrap_from_torch  # noqa: E402

checks = 0


def inp(rank, *shape, seed=0):
    """Rank `rank`'s input: integer values, different on every rank and for every seed."""
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n) * 7 + 13 * rank + 5 * seed) % 101).float().reshape(shape)


def same(got, want, what):
    global checks
    checks += 1
    if got is None or want is None:
        assert got is None and want is None, f"{what}: {got!r} vs {want!r}"
        return
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != " \
                                                  f"{tuple(want.shape)}"
    assert torch.equal(got, want), f"{what}: values differ\n{got}\n{want}"


def health_and_abort(c, native):
    """health() answers while the group is healthy and raises once it is aborted: both the
    native group's, as the engines' own watchdogs call them."""
    global checks
    assert c.health() is None and not native.aborted
    c.abort()
    assert native.aborted
    try:
        c.health()
    except RuntimeError as e:
        assert "aborted" in str(e)
    else:
        raise AssertionError("health() after abort() did not raise")
    native.aborted = False  # the stand-in's group goes on serving the checks after this one
    checks += 1


def common(c, w, me, name):
    same(c.all_reduce(inp(me, 4, 6)), sum(inp(r, 4, 6) for r in range(w)), f"{name} all_reduce")
    same(c.all_reduce(inp(me, 5), dist.ReduceOp.MAX), torch.stack([inp(r, 5) for r in range(w)])
         .amax(0), f"{name} all_reduce MAX")
    for dim in (-1, 0, 1, 2):
        same(c.all_gather(inp(me, 2, 3, 4), dim), torch.cat([inp(r, 2, 3, 4) for r in range(w)],
                                                            dim), f"{name} all_gather dim {dim}")
    same(c.all_gather(inp(me, 3, 5)), torch.cat([inp(r, 3, 5) for r in range(w)], -1),
         f"{name} all_gather default dim")
    dst = w - 1
    got = c.gather(inp(me, 3, 4), dst=dst, dim=-1)
    same(got, torch.cat([inp(r, 3, 4) for r in range(w)], -1) if me == dst else None,
         f"{name} gather")
    same(c.gather(inp(me, 3, 4), 0, 0), torch.cat([inp(r, 3, 4) for r in range(w)])
         if me == 0 else None, f"{name} gather dim 0")
    if w > 1:
        c.send(inp(me, 8, seed=1))
        same(c.recv((8,), torch.float32), inp((me - 1) % w, 8, seed=1),
             f"{name} send/recv ring")
    if w > 2:
        if me == 0:
            c.send(inp(me, 3), dst=2)
        if me == 2:
            same(c.recv(torch.Size([3]), torch.float32, src=0), inp(0, 3), f"{name} recv src")
    c.barrier()


def sglang(group, w, me):
    native = GlooNative(group)
    c = SglangCommunicator(group, unique_name="tp", native=native)
    ranks = dist.get_process_group_ranks(group)
    assert (c.rank, c.ranks, c.world_size, c.rank_in_group) == (dist.get_rank(), ranks, w, me)
    assert (c.first_rank, c.last_rank, c.is_first_rank, c.is_last_rank) == (
        ranks[0], ranks[-1], me == 0, me == w - 1)
    assert (c.next_rank, c.prev_rank) == (ranks[(me + 1) % w], ranks[(me - 1) % w])
    assert (c.unique_name, c.cpu_group, c.device_group) == ("tp", group, None)
    common(c, w, me, "sglang")

    out = [torch.empty(2, 3) for _ in range(w)]
    assert c.all_gather(inp(me, 2, 3), output_tensor_list=out) is None
    same(torch.stack(out), torch.stack([inp(r, 2, 3) for r in range(w)]), "output_tensor_list")
    out = torch.full((w * 2, 3), float("nan"))
    c.all_gather_into_tensor(out, inp(me, 2, 3))
    same(out, torch.cat([inp(r, 2, 3) for r in range(w)]), "all_gather_into_tensor")
    sizes = [r + 1 for r in range(w)]
    same(c.all_gatherv(inp(me, sizes[me], 4), sizes=sizes)[0],
         torch.cat([inp(r, sizes[r], 4) for r in range(w)]), "all_gatherv unequal")
    got = c.all_gatherv([inp(me, sizes[me], 2), inp(me, sizes[me], seed=2)], sizes=sizes)
    same(got[0], torch.cat([inp(r, sizes[r], 2) for r in range(w)]), "all_gatherv list 0")
    same(got[1], torch.cat([inp(r, sizes[r], seed=2) for r in range(w)]), "all_gatherv list 1")
    got = c.all_gatherv(inp(me, 2, 2))  # a list, as SGLang's
    assert isinstance(got, list) and len(got) == 1
    same(got[0], torch.cat([inp(r, 2, 2) for r in range(w)]), "all_gatherv equal")
    out = torch.full((sum(sizes), 4), float("nan"))
    assert c.all_gatherv(inp(me, sizes[me], 4), sizes, out)[0] is out
    same(out, torch.cat([inp(r, sizes[r], 4) for r in range(w)]), "all_gatherv into output")
    total = sum(inp(r, 3, w * 2) for r in range(w))
    same(c.reduce_scatter_along_dim(inp(me, 3, w * 2)), total[:, me * 2:(me + 1) * 2],
         "reduce_scatter_along_dim")

    total = sum(inp(r, w * 2, 3) for r in range(w))
    out = torch.full((2, 3), float("nan"))
    c.reduce_scatter_tensor(out, inp(me, w * 2, 3))
    same(out, total[me * 2:(me + 1) * 2], "reduce_scatter_tensor")
    out = torch.full((2, 3), float("nan"))
    assert c.reduce_scatter(out, [inp(me, 2, 3, seed=d) for d in range(w)]) is out
    same(out, sum(inp(r, 2, 3, seed=me) for r in range(w)), "reduce_scatter(output, list)")
    total = sum(inp(r, sum(sizes), 2) for r in range(w))
    start = sum(sizes[:me])
    same(c.reduce_scatterv(inp(me, sum(sizes), 2), sizes=sizes),
         total[start:start + sizes[me]], "reduce_scatterv")
    out = torch.empty(sizes[me], 2)
    assert c.reduce_scatterv(inp(me, sum(sizes), 2), out, sizes) is out
    same(out, total[start:start + sizes[me]], "reduce_scatterv into output")

    out = torch.full((w * 2, 3), float("nan"))
    c.all_to_all_single(out, inp(me, w * 2, 3))
    same(out, torch.cat([inp(s, w * 2, 3)[me * 2:(me + 1) * 2] for s in range(w)]),
         "all_to_all_single equal")
    # Rank s sends (s + d) % w + 1 rows to rank d.
    split = [[(s + d) % w + 1 for d in range(w)] for s in range(w)]
    x = inp(me, sum(split[me]), 3)
    out = torch.full((sum(split[s][me] for s in range(w)), 3), float("nan"))
    c.all_to_all_single(out, x, [split[s][me] for s in range(w)], split[me])
    want = [inp(s, sum(split[s]), 3)[sum(split[s][:me]):sum(split[s][:me + 1])]
            for s in range(w)]
    same(out, torch.cat(want), "all_to_all_single unequal")

    x = inp(me, 4, seed=3)
    assert c.broadcast(x, src=w - 1) is x
    same(x, inp(w - 1, 4, seed=3), "broadcast")

    # Nested capture contexts, as SGLang's module-level graph_capture opens its groups'.
    other = SglangCommunicator(group, unique_name="attn_tp", native=GlooNative(group))
    marker = object()
    with c.graph_capture(stream=marker) as ctx:
        assert ctx.stream is marker
    with c.graph_capture() as ctx:
        assert isinstance(ctx, GraphCaptureContext) and native.captures == [ctx.stream]
        with other.graph_capture(ctx) as inner:
            assert inner is ctx and other.native.captures == [ctx.stream]
    assert native.captures == [] and other.native.captures == []
    health_and_abort(c, native)
    c.destroy()
    assert native.closed and c.native is None


def vllm(group, w, me):
    native = GlooNative(group)
    c = VllmCommunicator(group, torch.device("cpu"), None, "tp:0", native=native)
    ranks = dist.get_process_group_ranks(group)
    assert (c.rank, c.world_size, c.ranks, c.rank_in_group) == (dist.get_rank(), w, ranks, me)
    assert (c.global_rank, c.global_world_size) == (dist.get_rank(), dist.get_world_size())
    assert (c.unique_name, c.cpu_group, c.device) == ("tp:0", group, torch.device("cpu"))
    common(c, w, me, "vllm")

    total = sum(inp(r, 3, w * 2) for r in range(w))
    same(c.reduce_scatter(inp(me, 3, w * 2)), total[:, me * 2:(me + 1) * 2],
         "reduce_scatter dim -1")
    total = sum(inp(r, w * 2, 3) for r in range(w))
    same(c.reduce_scatter(inp(me, w * 2, 3), 0), total[me * 2:(me + 1) * 2],
         "reduce_scatter dim 0")
    sizes = [w - r for r in range(w)]
    total = sum(inp(r, 2, sum(sizes)) for r in range(w))
    start = sum(sizes[:me])
    same(c.reduce_scatterv(inp(me, 2, sum(sizes)), sizes=sizes),
         total[:, start:start + sizes[me]], "reduce_scatterv dim -1")
    same(c.all_gatherv(inp(me, 2, sizes[me]), dim=1, sizes=sizes),
         torch.cat([inp(r, 2, sizes[r]) for r in range(w)], 1), "all_gatherv dim 1")
    same(c.all_gatherv(inp(me, 3, 2)), torch.cat([inp(r, 3, 2) for r in range(w)]),
         "all_gatherv default")
    h, logits = inp(me, 2), inp(me, 3)
    assert c.dispatch(h, logits) == (h, logits) and c.combine(h) is h
    c.prepare_communication_buffer_for_model(torch.nn.Linear(2, 2))
    health_and_abort(c, native)
    c.destroy()
    assert native.closed


def bootstrap(w, me):
    """tpcomm's bootstrap over torch.distributed's own store: the world, and a sub-group made
    with new_group, each a working bootstrap (barriers, the store), no port of tpcomm's own."""
    global checks
    world = bootstrap_from_torch()
    assert bootstrap_from_torch() is world
    assert (world.rank, world.world_size) == (me, w)
    world.store_set(f"hello/{me}", f"from {me}")
    world.barrier()
    assert [world.store_get(f"hello/{r}") for r in range(w)] == [
        f"from {r}".encode() for r in range(w)]
    evens = list(range(0, w, 2))
    odds = list(range(1, w, 2))
    # new_group is a collective of the world: every rank makes both.
    groups = {0: dist.new_group(evens), 1: dist.new_group(odds)}
    mine = groups[me % 2]
    sub = bootstrap_from_torch(mine)
    members = evens if me % 2 == 0 else odds
    assert (sub.rank, sub.world_size) == (members.index(me), len(members))
    if sub.rank == 0:
        sub.store_set("who", f"group {me % 2}")
    sub.barrier()
    assert sub.store_get("who") == f"group {me % 2}".encode()
    again = bootstrap_from_torch(mine)  # a second bootstrap of the same group: its own keys
    again.barrier()
    assert again.store_add("count", 1) <= len(members)
    again.barrier()
    assert again.store_add("count", 0) == len(members)
    checks += 4
    # Every key tpcomm wrote lives under "tpcomm/" in torch's store.
    store = dist.distributed_c10d._get_default_store()
    assert not store.check([f"hello/{me}"])
    world.barrier()


def heartbeat(w, me):
    """A rank that dies (no normal leave) is noticed through heartbeats on torch's store: a wait
    of the survivors ends with AbortedError naming it, long before its own deadline. The
    worker runs with TPCOMM_HEARTBEAT_TIMEOUT_MS=1000."""
    global checks
    import time

    world = bootstrap_from_torch()
    world.barrier()
    if me == w - 1:
        os._exit(0)  # dies: no normal leave, no goodbye
    start = time.monotonic()
    try:
        world.store_get("never", timeout_ms=60000)
        raise AssertionError("a wait outlived the dead rank")
    except tpcomm.AbortedError as e:
        assert f"rank {w - 1} stopped beating" in str(e), e
    took = time.monotonic() - start
    assert took < 10, f"noticed after {took:.1f} s"
    print(f"noticed after {took:.2f} s", flush=True)
    checks += 1


def main():
    cases, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                           world_size=world)
    try:
        if "adapters" in cases:
            sglang(dist.group.WORLD, world, rank)
            vllm(dist.group.WORLD, world, rank)
            # A sub-group whose ranks are not 0..n-1: the adapters speak of the group's ranks.
            tail = list(range(1, world))
            sub = dist.new_group(tail)
            if rank in tail:
                sglang(sub, len(tail), tail.index(rank))
                vllm(sub, len(tail), tail.index(rank))
        if "bootstrap" in cases:
            bootstrap(world, rank)
        if "heartbeat" in cases:
            heartbeat(world, rank)
        assert isinstance(tpcomm.version(), str)
        print(f"ok {checks}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
