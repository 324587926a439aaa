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


def test_torch_imports_after_tpcomm_loaded_nccl():
    """One libnccl.so.2 per process: tpcomm takes PyTorch's where it is installed, so importing
    torch after tpcomm loaded NCCL still works."""
    code = "import tpcomm; tpcomm.info(); import torch; print('ok', torch.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]


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


def test_the_compiled_ops_where_installed():
    """python/torch_ext, where installed: `tpcomm.torch` initialises it, its ops' shapes (meta,
    as torch.compile traces them) and its refusal of a CPU tensor. CI installs it; the GPU
    machine runs the ops themselves (test_torch_gpu.py)."""
    if os.environ.get("TPCOMM_REQUIRE_TORCH_EXT") != "1":
        pytest.importorskip("tpcomm_torch_ext")
    import torch
    import tpcomm.torch as tt

    assert tt.compiled()
    m = torch.empty(8, 3, device="meta")
    assert torch.ops.tpcomm_c.all_reduce(m, 1, "sum").shape == (8, 3)
    assert torch.ops.tpcomm_c.all_reduce_(m, 1, "sum") is m
    assert torch.ops.tpcomm_c.all_gather(m, 1, 4).shape == (32, 3)
    assert torch.ops.tpcomm_c.reduce_scatter(m, 1, 4, "sum").shape == (2, 3)
    with pytest.raises(RuntimeError, match="is not a multiple of the world size 3"):
        torch.ops.tpcomm_c.reduce_scatter(m, 1, 3, "sum")
    with pytest.raises(RuntimeError, match="x is on cpu; tpcomm takes CUDA tensors"):
        torch.ops.tpcomm_c.all_reduce(torch.ones(2), 1, "sum")
    with pytest.raises(RuntimeError, match="op 'mean' is not sum, prod, max, min or avg"):
        torch.ops.tpcomm_c.all_reduce(torch.ones(2), 1, "mean")
