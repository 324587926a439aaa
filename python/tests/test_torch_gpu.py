# SPDX-License-Identifier: Apache-2.0
"""tpcomm.torch on a GPU: `torch.library.opcheck` of every op, `torch.compile(fullgraph=True)`,
capture in `torch.cuda.graph` and replay with new data, the errors for bad tensors (world size
1, one process); and the two-process tensor-parallel MLP under torchrun (torchrun_mlp.py).
Skipped without PyTorch or a CUDA device."""
import os
import signal
import subprocess
import sys
import time

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
    torch.library.opcheck(torch.ops.tpcomm.gather, (x, h, 0))
    torch.library.opcheck(torch.ops.tpcomm.reduce_scatter, (x, h, "sum"))
    torch.library.opcheck(torch.ops.tpcomm.all_to_all, (x, h, None))
    torch.library.opcheck(torch.ops.tpcomm.all_to_all, (x.flatten()[:100], h, [100]))
    gamma = ints(64, low=1, high=3)
    torch.library.opcheck(torch.ops.tpcomm.all_reduce_add_rmsnorm,
                          (x, ints(8, 64), gamma, 1e-6, h, None, False))
    torch.library.opcheck(torch.ops.tpcomm.all_reduce_add_rmsnorm,
                          (x, None, gamma.float(), 1e-6, h, None, False, False, True))
    if hasattr(torch, "float8_e4m3fn"):
        torch.library.opcheck(torch.ops.tpcomm.all_reduce_add_rmsnorm,
                              (x, ints(8, 64), gamma, 1e-6, h, None, True))
        torch.library.opcheck(torch.ops.tpcomm.all_reduce_add_rmsnorm,
                              (ints(2, 256), ints(2, 256), ints(256, low=1, high=3), 1e-6, h,
                               None, False, True))
    experts, rows, weights = ints(11, 64, low=-1, high=2), moe_map(4, 2, 11), halves(4, 2)
    torch.library.opcheck(torch.ops.tpcomm.moe_finalize_all_reduce_add_rmsnorm,
                          (experts, rows, weights, ints(4, 64), ints(4, 64), gamma, 1e-6, h))
    torch.library.opcheck(torch.ops.tpcomm.moe_finalize_all_reduce_add_rmsnorm,
                          (experts, rows, weights.float(), None, None, gamma, 1e-6, h))
    torch.library.opcheck(torch.ops.tpcomm.lm_head_exchange, (ints(3, 40), h, 37, 3, None))
    torch.library.opcheck(torch.ops.tpcomm.lm_head_exchange, (ints(3, 40), h, 40, 0, [3]))


def moe_map(tokens, top_k, rows):
    """A MoE layer's map from (token, k) to an expert row: repeats, and rows never chosen."""
    return torch.randint(0, rows - 2, (tokens, top_k), device="cuda", dtype=torch.int32)


def halves(*shape, dtype=torch.bfloat16):
    """Router weights in {0, 0.5, 1}: every product and sum here exact."""
    return (torch.randint(0, 3, shape, device="cuda") * 0.5).to(dtype)


def test_moe_finalize_at_world_size_one(group):
    """The combine (top-k rows weighted, the shared expert added) then the fused norm, against
    torch, bf16 and f32 weights, with and without the shared expert and the residual."""
    experts = ints(40, 256, low=-1, high=2)
    rows = moe_map(9, 4, 40)
    gamma = ints(256, low=1, high=3)
    for weights in (halves(9, 4), halves(9, 4).float()):
        for shared in (ints(9, 256, low=-1, high=2), None):
            for residual in (ints(9, 256), None):
                x = (weights.float().unsqueeze(-1) * experts[rows.long()].float()).sum(1)
                if shared is not None:
                    x = x + shared.float()
                x = x.to(experts.dtype)
                norm_out, residual_out, _ = group.moe_finalize_all_reduce_add_rmsnorm(
                    experts, rows, weights, shared, residual, gamma, 1e-6)
                want = x if residual is None else x + residual
                assert torch.equal(residual_out, want)
                torch.testing.assert_close(norm_out.float(), rmsnorm(want, gamma), atol=0.05,
                                           rtol=0.02)
    with pytest.raises(tpcomm.InvalidArgumentError, match="top_k is 33"):
        group.moe_finalize_all_reduce_add_rmsnorm(experts, moe_map(2, 33, 40), halves(2, 33),
                                                  None, None, gamma, 1e-6)


def test_results_at_world_size_one(group):
    x = ints(8, 64)
    assert torch.equal(group.all_reduce(x), x)
    assert torch.equal(group.all_gather(x), x)
    assert torch.equal(group.all_gather(x, dim=1), x)
    assert torch.equal(group.gather(x), x)
    assert torch.equal(group.gather(x, dst=0, dim=0), x)
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


def rmsnorm(v, gamma, eps=1e-6):
    v = v.float()
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()


def test_norm_forms_at_world_size_one(group):
    """No residual, an f32 gamma, Gemma's 1 + gamma, per-group FP8 scales."""
    x = ints(4, 256)
    gamma32 = torch.rand(256, device="cuda") + 0.5
    norm_out, residual_out, scales = group.fused_all_reduce_add_rmsnorm(
        x, None, gamma32, 1e-6, gamma_plus_one=True)
    assert torch.equal(residual_out, x)
    torch.testing.assert_close(norm_out.float(), rmsnorm(x, gamma32 + 1), atol=0.05, rtol=0.02)
    assert scales.numel() == 0
    if not hasattr(torch, "float8_e4m3fn"):
        return
    residual = ints(4, 256)
    gamma = ints(256, low=1, high=3)
    norm_out, residual_out, scales = group.fused_all_reduce_add_rmsnorm(
        x, residual, gamma, 1e-6, fp8_group_scales=True)
    assert torch.equal(residual_out, x + residual)
    assert scales.shape == (4, 2) and norm_out.dtype == torch.float8_e4m3fn
    ref = rmsnorm(residual_out, gamma).view(4, 2, 128)
    want = (ref.abs().amax(-1) / 448).clamp(min=1 / (448 * 512))
    torch.testing.assert_close(scales, want, rtol=1e-4, atol=0)
    got = norm_out.float().view(4, 2, 128) * scales.unsqueeze(-1)
    torch.testing.assert_close(got, ref, atol=0.02, rtol=0.07)
    with pytest.raises(ValueError, match="multiple of 128"):
        group.fused_all_reduce_add_rmsnorm(ints(2, 100), None, ints(100), 1e-6,
                                           fp8_group_scales=True)


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
    with pytest.raises(ValueError, match="root 1 is not a rank of 1"):
        torch.ops.tpcomm.gather(torch.zeros(4, device="cuda"), h, 1)
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


def _probe(mode, op, sig, port, timeout_ms=None):
    """Runs fault_probe.py's two ranks (rank 1 the victim); returns the survivor's return code,
    its output, the victim's FAULT time and the monotonic time the survivor ended."""
    env = dict(os.environ)
    env.pop("TPCOMM_ASYNC_ERROR_HANDLING", None)
    if timeout_ms is not None:
        env["TPCOMM_TIMEOUT_MS"] = str(timeout_ms)
    script = os.path.join(HERE, "fault_probe.py")
    procs = [subprocess.Popen([sys.executable, script, str(r), str(port), mode, op, sig, "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in (0, 1)]
    survivor, victim = procs
    deadline = time.monotonic() + 120
    while survivor.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    ended = time.monotonic()
    if survivor.poll() is None:
        survivor.kill()
    victim.kill()  # stopped, or already gone
    out, err = survivor.communicate()
    vout, verr = victim.communicate()
    fault = [float(line.split()[1]) for line in vout.splitlines() if line.startswith("FAULT ")]
    assert fault, vout + verr
    return survivor.returncode, out + err, fault[0], ended


@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="no GPU")
def test_graph_replays_after_a_kill_take_the_process_down_by_default():
    rc, text, fault, ended = _probe("default", "all_reduce", "KILL", 29621)
    assert rc == -signal.SIGABRT, text
    assert "taking the process down" in text, text
    assert "WRONG" not in text, text
    assert ended - fault < 1.5, (ended - fault, text)
    print(f"teardown {ended - fault:.3f} s after the kill")


@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="no GPU")
def test_graph_replays_after_a_kill_are_poisoned_and_the_callback_runs():
    rc, text, fault, _ = _probe("callback", "fused", "KILL", 29622)
    assert rc == 0, text
    told = [float(line.split()[1]) for line in text.splitlines() if line.startswith("TOLD ")]
    assert told and told[0] - fault < 1.0, text
    assert "POISONED" in text and "HEALTH AbortedError" in text, text
    print(f"callback {told[0] - fault:.3f} s after the kill")


@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="no GPU")
def test_graph_replays_after_a_stop_are_poisoned_at_the_deadline():
    rc, text, fault, _ = _probe("raise", "all_reduce", "STOP", 29623, timeout_ms=2000)
    assert rc == 0, text
    poisoned = [float(line.split()[1]) for line in text.splitlines()
                if line.startswith("POISONED ")]
    assert poisoned and poisoned[0] - fault < 3.0, text
    assert "HEALTH TimeoutError" in text, text
    print(f"poisoned {poisoned[0] - fault:.3f} s after the stop")


def test_health_and_abort_on_the_group():
    g = TpcommGroup(device=0, bootstrap=tpcomm.Bootstrap(rank=0, world_size=1),
                    failure_mode="raise")
    try:
        g.health()
        g.abort()
        with pytest.raises(tpcomm.AbortedError):
            g.health()
        with pytest.raises(tpcomm.AbortedError):
            g.all_reduce(torch.ones(8, device="cuda"))
    finally:
        g.close()
