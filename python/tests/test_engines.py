# SPDX-License-Identifier: Apache-2.0
"""The engine adapters (`tpcomm.engines`) called as SGLang's and vLLM's code calls their
communicators, and tpcomm's bootstrap over torch.distributed's store: ranks as processes on the
CPU (gloo), a stand-in for the GPU calls (engines_standin.py). Needs PyTorch; skipped without
it unless TPCOMM_REQUIRE_TORCH=1 (CI), which makes its absence a failure."""
import os
import subprocess
import sys

import pytest

from conftest import free_port

if os.environ.get("TPCOMM_REQUIRE_TORCH") != "1":
    pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engines_worker.py")


def run_ranks(cases, world, env=None):
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, WORKER, cases, str(r), str(world), port],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=None if env is None else {**os.environ, **env})
             for r in range(world)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    if cases == "heartbeat":  # the last rank dies on purpose
        procs, outs = procs[:-1], outs[:-1]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}:\n{out}"
        assert out.strip().splitlines()[-1].startswith("ok "), f"rank {r}:\n{out}"
    return outs


@pytest.mark.parametrize("world", [2, 3])
def test_adapters_follow_the_engines_conventions(world):
    outs = run_ranks("adapters", world)
    assert all(int(o.split()[-1]) >= 38 for o in outs), outs


@pytest.mark.parametrize("world", [2, 4])
def test_bootstrap_over_torch_distributed_store(world):
    run_ranks("bootstrap", world)


@pytest.mark.parametrize("world", [2, 3])
def test_a_dead_rank_is_noticed_over_torch_distributed_store(world):
    run_ranks("heartbeat", world, {"TPCOMM_HEARTBEAT_TIMEOUT_MS": "1000"})


def test_group_without_a_gpu_says_so():
    import tpcomm
    from tpcomm.torch import TpcommGroup
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(tpcomm.UnavailableError, match="no CUDA device"):
        TpcommGroup()


def test_reduce_ops_as_torch_spells_them():
    import torch.distributed as dist
    from tpcomm.torch import reduce_op

    assert [reduce_op(o) for o in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MAX,
                                   dist.ReduceOp.MIN, dist.ReduceOp.AVG, "sum")] == [
        "sum", "prod", "max", "min", "avg", "sum"]
