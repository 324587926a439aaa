# SPDX-License-Identifier: Apache-2.0
"""tpcomm.torch on a GPU: `torch.library.opcheck` of every op, `torch.compile(fullgraph=True)`,
capture in `torch.cuda.graph` and replay with new data, the errors for bad tensors (world size
1, one process); and the two-process tensor-parallel MLP under torchrun (torchrun_mlp.py).
Skipped without PyTorch or a CUDA device."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import tpcomm  # noqa: E402
from tpcomm.torch import TpcommGroup  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def group():
    g = TpcommGroup(device=0, bootstrap=tpcomm.Bootstrap(rank=0, world_size=1))
    yield g
    g.close()


def ints(*shape, dtype=torch.bfloat16, low=-4, high=5):
    """Small integers: exact in every dtype and every sum here."""
    return torch.randint(low, high, shape, device="cuda").to(dtype)


def test_opcheck_every_op(group):
    h = group.handle
    x = ints(8, 64)
    torch.library.opcheck(torch.ops.tpcomm.all_reduce, (x, h, "sum"))
    torch.library.opcheck(torch.ops.tpcomm.all_gather, (x, h))
    torch.library.opcheck(torch.ops.tpcomm.reduce_scatter, (x, h, "sum"))
    torch.library.opcheck(torch.ops.tpcomm.all_to_all, (x, h, None))
    torch.library.opcheck(torch.ops.tpcomm.all_to_all, (x.flatten()[:100], h, [100]))
    gamma = ints(64, low=1, high=3)
    torch.library.opcheck(torch.ops.tpcomm.all_reduce_add_rmsnorm,
                          (x, ints(8, 64), gamma, 1e-6, h, None, False))
    if hasattr(torch, "float8_e4m3fn"):
        torch.library.opcheck(torch.ops.tpcomm.all_reduce_add_rmsnorm,
                              (x, ints(8, 64), gamma, 1e-6, h, None, True))
    torch.library.opcheck(torch.ops.tpcomm.lm_head_exchange, (ints(3, 40), h, 37, 3, None))
    torch.library.opcheck(torch.ops.tpcomm.lm_head_exchange, (ints(3, 40), h, 40, 0, [3]))


def test_results_at_world_size_one(group):
    x = ints(8, 64)
    assert torch.equal(group.all_reduce(x), x)
    assert torch.equal(group.all_gather(x), x)
    assert torch.equal(group.all_gather(x, dim=1), x)
    assert torch.equal(group.reduce_scatter(x), x)
    assert torch.equal(group.all_to_all_single(x), x)
    shards = ints(3, 40)
    assert torch.equal(group.lm_head_exchange(shards, 37, 3), shards[:, :37])
    residual = ints(8, 64)
    gamma = ints(64, low=1, high=3)
    norm_out, residual_out, row_scales = group.fused_all_reduce_add_rmsnorm(x, residual, gamma,
                                                                            1e-6)
    assert torch.equal(residual_out, x + residual)
    ref = residual_out.float()
    ref = ref * torch.rsqrt(ref.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.float()
    torch.testing.assert_close(norm_out.float(), ref, atol=0.05, rtol=0.02)
    assert row_scales.numel() == 0


def test_bad_tensors_are_refused_clearly(group):
    h = group.handle
    with pytest.raises(TypeError, match="dtype torch.complex64, which tpcomm does not support"):
        torch.ops.tpcomm.all_reduce(torch.zeros(4, dtype=torch.complex64, device="cuda"), h)
    with pytest.raises(ValueError, match="x is not contiguous"):
        torch.ops.tpcomm.all_reduce(torch.zeros(4, 4, device="cuda").t(), h)
    with pytest.raises(ValueError, match="x is on cpu, but the group's GPU is cuda:0"):
        torch.ops.tpcomm.all_reduce(torch.zeros(4), h)
    with pytest.raises(ValueError, match="op 'mean' is not one of"):
        torch.ops.tpcomm.all_reduce(torch.zeros(4, device="cuda"), h, "mean")
    with pytest.raises(ValueError, match="no group has handle 12345"):
        torch.ops.tpcomm.all_reduce(torch.zeros(4, device="cuda"), 12345)
    # The C API's checks come back as tpcomm errors with its message.
    with pytest.raises(tpcomm.InvalidArgumentError, match="tpcomm_all_reduce: "):
        group.group.all_reduce(tpcomm.tensor(0, "float32", [4], 0),
                               tpcomm.tensor(0, "float32", [4], 0))


def test_torch_compile_fullgraph(group):
    h = group.handle

    def step(x, residual, gamma):
        y = torch.ops.tpcomm.all_reduce(x * 2, h, "sum")
        norm, res, _ = torch.ops.tpcomm.all_reduce_add_rmsnorm(y, residual, gamma, 1e-6, h,
                                                                None, False)
        return torch.ops.tpcomm.all_gather(norm, h), res

    compiled = torch.compile(step, fullgraph=True)
    x, residual, gamma = ints(4, 32), ints(4, 32), ints(32, low=1, high=3)
    got = compiled(x, residual, gamma)
    want = step(x, residual, gamma)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_cuda_graph_capture_and_replay(group):
    x = torch.empty(16, 128, dtype=torch.bfloat16, device="cuda")
    residual = torch.empty_like(x)
    gamma = ints(128, low=1, high=3)
    x.copy_(ints(16, 128))
    residual.copy_(ints(16, 128))
    # Warm-up outside the capture, as engines do.
    group.all_reduce(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with group.graph_capture() as stream:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            y = group.all_reduce(x)
            norm, res, _ = group.fused_all_reduce_add_rmsnorm(y, residual, gamma, 1e-6)
    for _ in range(3):
        x.copy_(ints(16, 128))
        residual.copy_(ints(16, 128))
        y.fill_(float("nan"))
        res.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, x)
        assert torch.equal(res, x + residual)


@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="no GPU")
def test_two_process_mlp_under_torchrun():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", "29611", os.path.join(HERE, "torchrun_mlp.py")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("matches the reference") == 2, r.stdout + r.stderr
