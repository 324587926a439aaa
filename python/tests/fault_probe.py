# SPDX-License-Identifier: Apache-2.0
"""One rank of the graph-replay fault probe (test_torch_gpu.py starts two): a `TpcommGroup` on
GPU 0, a CUDA graph of four collectives captured under `graph_capture()` and replayed in a loop,
as engines run decode. The victim rank kills (SIGKILL) or stops (SIGSTOP) itself after 40
replays, printing `FAULT <monotonic time>` first. The survivor never asks the group anything: it
checks each replay's output (every element exact, or NaN once poisoned) and prints `POISONED
<time>` at the first poisoned replay and `TOLD <time> <error>` when its failure callback runs;
with the default failure mode (teardown) the watchdog takes it down instead.

    python fault_probe.py RANK PORT MODE OP SIGNAL VICTIM
    MODE: default | raise | callback;  OP: all_reduce | fused;  SIGNAL: KILL | STOP
"""
import os
import signal
import sys
import time

import torch

import tpcomm
from tpcomm.torch import TpcommGroup


def main():
    rank, port, mode, op, sig, victim = sys.argv[1:7]
    rank, port, victim = int(rank), int(port), int(victim)
    boot = tpcomm.Bootstrap(rank=rank, world_size=2, local_rank=rank, local_world_size=2,
                            store_port=port)
    told = []
    kwargs = {}
    if mode != "default":
        kwargs["failure_mode"] = mode
    if mode == "callback":
        kwargs["on_failure"] = lambda error: told.append((time.monotonic(), str(error)))
    group = TpcommGroup(device=0, bootstrap=boot, **kwargs)
    hidden = 7168 if op == "fused" else 4096
    x = torch.zeros(8, hidden, dtype=torch.bfloat16, device="cuda")
    residual = torch.zeros_like(x)
    gamma = torch.zeros(hidden, dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with group.graph_capture() as stream:
        with torch.cuda.graph(graph, stream=stream):
            y = x
            for _ in range(4):
                if op == "fused":
                    y, _res, _scales = group.fused_all_reduce_add_rmsnorm(y, residual, gamma,
                                                                          1e-6)
                else:
                    y = group.all_reduce(y)
    torch.cuda.synchronize()
    poisoned = None
    start = time.monotonic()
    for i in range(100000):
        if rank == victim and i == 40:
            print(f"FAULT {time.monotonic():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL if sig == "KILL" else signal.SIGSTOP)
        graph.replay()
        torch.cuda.synchronize()
        nan = int(torch.isnan(y).sum())
        exact = int((y == 0).sum())
        if nan + exact != y.numel():
            print(f"WRONG replay {i}: {y.numel() - nan - exact} elements neither exact nor NaN",
                  flush=True)
            sys.exit(3)
        if poisoned is not None and nan != y.numel():
            print(f"WRONG replay {i}: not wholly poisoned after a poisoned replay", flush=True)
            sys.exit(3)
        if nan and poisoned is None:
            poisoned = time.monotonic()
            print(f"POISONED {poisoned:.6f} replay {i}", flush=True)
        if told and poisoned is not None:
            print(f"TOLD {told[0][0]:.6f} {told[0][1]}", flush=True)
            break
        if poisoned is not None and mode == "raise" and time.monotonic() - poisoned > 0.5:
            break
        if time.monotonic() - start > 30:
            print("WRONG: nothing happened within 30 s", flush=True)
            sys.exit(4)
    try:
        group.health()
        print("WRONG: health() did not raise after the fault", flush=True)
        sys.exit(5)
    except tpcomm.TpcommError as e:
        print(f"HEALTH {type(e).__name__}: {e}", flush=True)
    os._exit(0)  # the peer is gone: skip the collective teardown


if __name__ == "__main__":
    main()
