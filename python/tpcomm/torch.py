# SPDX-License-Identifier: Apache-2.0
"""PyTorch ops over tpcomm: `torch.ops.tpcomm.*`, registered with `torch.library` with fake
(meta) implementations, so that `torch.compile(fullgraph=True)` traces them and
`torch.cuda.graph` captures them; and `TpcommGroup`, shaped like SGLang's `GroupCoordinator`.

Ops take the group as an int handle (`TpcommGroup.handle`, an entry of the table that
`register_group` fills), tensors by pointer (`data_ptr()`) and run on
`torch.cuda.current_stream()`. They are out-of-place: each returns new tensors. Every rank calls
the same ops in the same order.

    group = TpcommGroup()                      # torchrun's environment, this rank's GPU
    y = torch.ops.tpcomm.all_reduce(x, group.handle, "sum")
    with group.graph_capture() as stream:      # tpcomm's capture scope around the capture
        with torch.cuda.graph(graph, stream=stream):
            y = group.all_reduce(x)
"""
import contextlib
import os
from typing import List, Optional, Tuple

import torch

import tpcomm
from tpcomm import _torch_moe  # noqa: F401 - registers the MoE op
from tpcomm._compiled import _compiled_call, compiled
from tpcomm._compiled import extension as _extension
from tpcomm._torch_common import (_check, _desc, _fused_checks, _fused_outputs, _stream,
                                  get_group, register_group, unregister_group)
from tpcomm._torch_store import _torch_distributed_initialized, bootstrap_from_torch

__all__ = ["TpcommGroup", "bootstrap_from_torch", "compiled", "get_group", "register_group",
           "unregister_group"]

# ---- ops --------------------------------------------------------------------------------------


def reduce_op(op):
    """tpcomm's name of a reduction: one of `tpcomm.REDUCE_OPS`, or a
    `torch.distributed.ReduceOp` (SUM, PRODUCT, MAX, MIN, AVG) as torch users pass it."""
    if isinstance(op, str):
        return op
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    name = name.lower()
    return "prod" if name == "product" else name


def _all_reduce_checks(x, group, op, name="all_reduce"):
    g = get_group(group)
    _check(x, "x", name, g)
    if op not in tpcomm.REDUCE_OPS:
        raise ValueError(f"tpcomm::{name}: op {op!r} is not one of {sorted(tpcomm.REDUCE_OPS)}")
    return g


@torch.library.custom_op("tpcomm::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, group: int, op: str = "sum") -> torch.Tensor:
    """The reduction of `x` over every rank of the group."""
    g = _all_reduce_checks(x, group, op)
    out = torch.empty_like(x)
    g.all_reduce(_desc(x), _desc(out), op, _stream(x.device))
    return out


@all_reduce.register_fake
def _(x, group, op="sum"):
    _all_reduce_checks(x, group, op)
    return torch.empty_like(x)


def to_dim0(x, dim):
    """`x` with dimension `dim` moved first, contiguous (the layout the dim-0 ops take), and
    `dim` made non-negative."""
    if not -max(x.dim(), 1) <= dim < max(x.dim(), 1):
        raise IndexError(f"tpcomm: dim {dim} is out of range for a tensor of shape "
                         f"{tuple(x.shape)}")
    dim = dim + max(x.dim(), 1) if dim < 0 else dim
    return (x if dim == 0 else x.movedim(dim, 0).contiguous()), dim


def from_dim0(gathered, parts, moved_shape, dim):
    """The dim-0 concatenation of `parts` blocks of `moved_shape` (`gathered`) as the
    concatenation along `dim` of the tensors they came from."""
    if dim == 0:
        return gathered
    blocks = gathered.reshape(parts, *moved_shape)
    return torch.cat(blocks.movedim(1, dim + 1).unbind(0), dim=dim)


def _gathered_shape(x, world):
    return (world * x.shape[0], *x.shape[1:]) if x.dim() > 0 else (world,)


@torch.library.custom_op("tpcomm::all_gather", mutates_args=())
def all_gather(x: torch.Tensor, group: int) -> torch.Tensor:
    """Every rank's `x`, concatenated along dimension 0 in rank order."""
    g = get_group(group)
    _check(x, "x", "all_gather", g)
    out = x.new_empty(_gathered_shape(x, g.world_size))
    g.all_gather(_desc(x), _desc(out), _stream(x.device))
    return out


@all_gather.register_fake
def _(x, group):
    g = get_group(group)
    _check(x, "x", "all_gather", g)
    return x.new_empty(_gathered_shape(x, g.world_size))


def _gather_shape(x, g, root):
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < g.world_size:
        raise ValueError(f"tpcomm::gather: root {root!r} is not a rank of {g.world_size}")
    if g.rank == root:
        return _gathered_shape(x, g.world_size)
    return (0, *x.shape[1:]) if x.dim() > 0 else (0,)


@torch.library.custom_op("tpcomm::gather", mutates_args=())
def gather(x: torch.Tensor, group: int, root: int) -> torch.Tensor:
    """On rank `root`, every rank's `x` concatenated along dimension 0 in rank order; elsewhere
    an empty tensor (no rows)."""
    g = get_group(group)
    _check(x, "x", "gather", g)
    out = x.new_empty(_gather_shape(x, g, root))
    g.gather(_desc(x), _desc(out) if g.rank == root else None, root, _stream(x.device))
    return out


@gather.register_fake
def _(x, group, root):
    g = get_group(group)
    _check(x, "x", "gather", g)
    return x.new_empty(_gather_shape(x, g, root))


def _scattered_shape(x, g, op_name):
    if x.dim() == 0 or x.shape[0] % g.world_size != 0:
        raise ValueError(f"tpcomm::{op_name}: x's first dimension ({tuple(x.shape)}) is not a "
                         f"multiple of the world size {g.world_size}")
    return (x.shape[0] // g.world_size, *x.shape[1:])


@torch.library.custom_op("tpcomm::reduce_scatter", mutates_args=())
def reduce_scatter(x: torch.Tensor, group: int, op: str = "sum") -> torch.Tensor:
    """This rank's block (along dimension 0) of the reduction of `x` over every rank."""
    g = _all_reduce_checks(x, group, op, "reduce_scatter")
    out = x.new_empty(_scattered_shape(x, g, "reduce_scatter"))
    g.reduce_scatter(_desc(x), _desc(out), op, _stream(x.device))
    return out


@reduce_scatter.register_fake
def _(x, group, op="sum"):
    g = _all_reduce_checks(x, group, op, "reduce_scatter")
    return x.new_empty(_scattered_shape(x, g, "reduce_scatter"))


def _all_to_all_shape(x, g, counts):
    if counts is None:
        if x.numel() % g.world_size != 0:
            raise ValueError(f"tpcomm::all_to_all: x has {x.numel()} elements, not a multiple "
                             f"of the world size {g.world_size}")
        return tuple(x.shape)
    w = g.world_size
    if len(counts) != w * w:
        raise ValueError(f"tpcomm::all_to_all: counts has {len(counts)} entries, not world "
                         f"size^2 = {w * w}")
    sent = sum(counts[g.rank * w + d] for d in range(w))
    if sent != x.numel():
        raise ValueError(f"tpcomm::all_to_all: x has {x.numel()} elements, but counts send "
                         f"{sent} from rank {g.rank}")
    return (sum(counts[s * w + g.rank] for s in range(w)),)


@torch.library.custom_op("tpcomm::all_to_all", mutates_args=())
def all_to_all(x: torch.Tensor, group: int, counts: Optional[List[int]] = None) -> torch.Tensor:
    """Equal split (chunk j of the flattened `x` to rank j; same shape out), or with `counts`
    (`counts[s * world + d]` elements from rank s to rank d; a 1-d result in order of source)."""
    g = get_group(group)
    _check(x, "x", "all_to_all", g)
    out = x.new_empty(_all_to_all_shape(x, g, counts))
    g.all_to_all(_desc(x), _desc(out), counts, _stream(x.device))
    return out


@all_to_all.register_fake
def _(x, group, counts=None):
    g = get_group(group)
    _check(x, "x", "all_to_all", g)
    return x.new_empty(_all_to_all_shape(x, g, counts))


def _run_fused(call, x, residual, gamma, eps, fp8_scale, fp8_row_scales, fp8_group_scales,
               gamma_plus_one, shape=None):
    """The outputs of a fused norm (of `shape`, else x's), written by `call` (a `Group` method
    with `all_reduce_add_rmsnorm`'s arguments): (norm_out, residual_out, scales)."""
    norm_out, residual_out, scales = _fused_outputs(x, fp8_scale, fp8_row_scales,
                                                    fp8_group_scales, shape)
    call(_desc(x), None if residual is None else _desc(residual), _desc(gamma), eps,
         _desc(norm_out), _desc(residual_out),
         fp8_scale=None if fp8_scale is None else _desc(fp8_scale),
         fp8_row_scales=_desc(scales) if fp8_row_scales else None,
         fp8_group_scales=_desc(scales) if fp8_group_scales else None,
         gamma_plus_one=gamma_plus_one, stream=_stream(x.device))
    return norm_out, residual_out, scales


@torch.library.custom_op("tpcomm::all_reduce_add_rmsnorm", mutates_args=())
def all_reduce_add_rmsnorm(x: torch.Tensor, residual: Optional[torch.Tensor],
                           gamma: torch.Tensor, eps: float, group: int,
                           fp8_scale: Optional[torch.Tensor] = None,
                           fp8_row_scales: bool = False, fp8_group_scales: bool = False,
                           gamma_plus_one: bool = False
                           ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(norm_out, residual_out, scales): residual_out = sum over ranks(x) + residual (the sum
    alone when `residual` is None), norm_out = RMSNorm(residual_out) * gamma (`1 + gamma` with
    `gamma_plus_one`, as Gemma's norm; `gamma` in x's dtype or float32), in f8e4m3 with
    `fp8_scale` (a static scale), `fp8_row_scales` (dynamic per-row scales, returned as
    [tokens]) or `fp8_group_scales` (one per 128 elements of a row, returned as
    [tokens, hidden / 128]); `scales` is empty otherwise."""
    g = _fused_checks(x, residual, gamma, group, fp8_scale, fp8_row_scales, fp8_group_scales)
    return _run_fused(g.all_reduce_add_rmsnorm, x, residual, gamma, eps, fp8_scale,
                      fp8_row_scales, fp8_group_scales, gamma_plus_one)


@all_reduce_add_rmsnorm.register_fake
def _(x, residual, gamma, eps, group, fp8_scale=None, fp8_row_scales=False,
      fp8_group_scales=False, gamma_plus_one=False):
    _fused_checks(x, residual, gamma, group, fp8_scale, fp8_row_scales, fp8_group_scales)
    return _fused_outputs(x, fp8_scale, fp8_row_scales, fp8_group_scales)


def _scattered_rows(x, g):
    if x.dim() != 2 or x.shape[0] % g.world_size != 0:
        raise ValueError(f"tpcomm::reduce_scatter_add_rmsnorm: x must be [tokens, hidden] with "
                         f"tokens a multiple of {g.world_size}, not {tuple(x.shape)}")
    return (x.shape[0] // g.world_size, x.shape[1])


@torch.library.custom_op("tpcomm::reduce_scatter_add_rmsnorm", mutates_args=())
def reduce_scatter_add_rmsnorm(x: torch.Tensor, residual: Optional[torch.Tensor],
                               gamma: torch.Tensor, eps: float, group: int,
                               fp8_scale: Optional[torch.Tensor] = None,
                               fp8_row_scales: bool = False, fp8_group_scales: bool = False,
                               gamma_plus_one: bool = False
                               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sequence-parallel `all_reduce_add_rmsnorm`: `x` [tokens, hidden] summed over the
    ranks, this rank keeping its tokens / world rows, then the residual add (`residual` those
    rows) and RMSNorm of them; returns (norm_out, residual_out, scales) of those rows."""
    g = _fused_checks(x, residual, gamma, group, fp8_scale, fp8_row_scales, fp8_group_scales)
    return _run_fused(g.reduce_scatter_add_rmsnorm, x, residual, gamma, eps, fp8_scale,
                      fp8_row_scales, fp8_group_scales, gamma_plus_one, _scattered_rows(x, g))


@reduce_scatter_add_rmsnorm.register_fake
def _(x, residual, gamma, eps, group, fp8_scale=None, fp8_row_scales=False,
      fp8_group_scales=False, gamma_plus_one=False):
    g = _fused_checks(x, residual, gamma, group, fp8_scale, fp8_row_scales, fp8_group_scales)
    return _fused_outputs(x, fp8_scale, fp8_row_scales, fp8_group_scales, _scattered_rows(x, g))


def _lm_head_shape(shard_logits, g, vocab, rows, rows_per_rank):
    if rows_per_rank is not None:
        if len(rows_per_rank) != g.world_size:
            raise ValueError(f"tpcomm::lm_head_exchange: rows_per_rank has {len(rows_per_rank)} "
                             f"entries, not the world size {g.world_size}")
        return (rows_per_rank[g.rank], vocab)
    return (rows, vocab)


@torch.library.custom_op("tpcomm::lm_head_exchange", mutates_args=())
def lm_head_exchange(shard_logits: torch.Tensor, group: int, vocab: int, rows: int,
                     rows_per_rank: Optional[List[int]] = None) -> torch.Tensor:
    """The vocabulary-sharded LM head's exchange: `shard_logits` [every rank's rows, S] in
    rank-block order; returns this rank's rows over the whole vocabulary, [rows, vocab]. Every
    rank holds `rows` rows, or `rows_per_rank[r]` (eager, unequal batches)."""
    g = get_group(group)
    _check(shard_logits, "shard_logits", "lm_head_exchange", g)
    shape = _lm_head_shape(shard_logits, g, vocab, rows, rows_per_rank)
    out = shard_logits.new_empty(shape)
    g.lm_head_exchange(_desc(shard_logits), _desc(out),
                       rows if rows_per_rank is None else list(rows_per_rank),
                       _stream(shard_logits.device))
    return out


@lm_head_exchange.register_fake
def _(shard_logits, group, vocab, rows, rows_per_rank=None):
    g = get_group(group)
    _check(shard_logits, "shard_logits", "lm_head_exchange", g)
    return shard_logits.new_empty(_lm_head_shape(shard_logits, g, vocab, rows, rows_per_rank))


# ---- the group --------------------------------------------------------------------------------


class TpcommGroup:
    """A group over tpcomm with its own calling conventions (the engines' are in
    `tpcomm.engines`, built on this class).

    Its ranks: `bootstrap`; by default torch.distributed's world over its own store when
    torch.distributed is initialized (`bootstrap_from_torch()`, no second port), else the
    launcher's environment (`tpcomm.Bootstrap()`: torchrun, mpirun, srun, `tpcomm launch`). Its
    GPU: `device`, default `local_rank % device_count`.

    When the group fails (a lost rank, a kernel that gave up, ranks that called different
    collectives), its watchdog acts without being asked: by default it takes the process down
    ("teardown"), as PyTorch's NCCL process groups do, since an engine replaying CUDA graphs would
    otherwise go on with poisoned (NaN) results. `failure_mode="raise"` (or
    TPCOMM_ASYNC_ERROR_HANDLING=raise) marks the group failed instead, so that `health()` and the
    next call raise; "callback" also calls `on_failure(error)` on the watchdog's thread.
    """

    def __init__(self, device=None, bootstrap=None, custom_all_reduce=True, nccl=True,
                 fusion=True, failure_mode=None, on_failure=None, fusion_max_tokens=0,
                 fusion_hidden=0, deterministic=None):
        if not torch.cuda.is_available():
            raise tpcomm.UnavailableError(7, "tpcomm: no CUDA device is visible to this process "
                                             "(torch.cuda.is_available() is False)")
        if bootstrap is None:
            bootstrap = (bootstrap_from_torch() if _torch_distributed_initialized()
                         else tpcomm.Bootstrap())
        self.bootstrap = bootstrap
        if device is None:
            device = self.bootstrap.local_rank % torch.cuda.device_count()
        self.device = torch.device("cuda", device if isinstance(device, int) else device.index)
        torch.cuda.set_device(self.device)
        self.group = tpcomm.Group(self.bootstrap, self.device.index, custom_all_reduce, nccl,
                                  fusion, fusion_max_tokens, fusion_hidden, deterministic)
        if failure_mode is None:
            failure_mode = os.environ.get("TPCOMM_ASYNC_ERROR_HANDLING", "teardown").lower()
        self.group.set_failure_mode(failure_mode, on_failure)
        self.rank_in_group = self.group.rank
        self.world_size = self.group.world_size
        self.handle = register_group(self.group)
        self.c_handle = self.group.handle.value  # the C handle, for the compiled ops
        self._capture_stream = None

    def health(self):
        """Raises the group's failure (a `tpcomm.TpcommError`), if it has failed."""
        self.group.health()

    def abort(self):
        """Makes every waiting kernel give up and every later call raise; safe from any thread."""
        self.group.abort()

    def close(self):
        if self.handle is not None:
            unregister_group(self.handle)
            self.handle = None
            self.group.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Collectives: the ops, so that they trace under torch.compile and capture in graphs.

    def all_reduce(self, x, op="sum"):
        """The reduction of `x` over every rank (`op`: a name of `tpcomm.REDUCE_OPS` or a
        `torch.distributed.ReduceOp`), in a new tensor."""
        if _extension is not None:
            return _compiled_call(torch.ops.tpcomm_c.all_reduce, x, self.c_handle, reduce_op(op))
        return torch.ops.tpcomm.all_reduce(x, self.handle, reduce_op(op))

    def all_reduce_(self, x, op="sum"):
        """`all_reduce` into `x` itself (in place, as engines call it); returns `x`."""
        if _extension is not None:
            return _compiled_call(torch.ops.tpcomm_c.all_reduce_, x, self.c_handle,
                                  reduce_op(op))
        _check(x, "x", "all_reduce_", self.group)
        op = reduce_op(op)
        if op not in tpcomm.REDUCE_OPS:
            raise ValueError(f"tpcomm::all_reduce_: op {op!r} is not one of "
                             f"{sorted(tpcomm.REDUCE_OPS)}")
        self.group.all_reduce(_desc(x), _desc(x), op, _stream(x.device))
        return x

    def all_gather(self, x, dim=-1):
        """Every rank's `x` concatenated along `dim` (the last by default, as SGLang's)."""
        moved, dim = to_dim0(x, dim)
        if _extension is not None:
            gathered = _compiled_call(torch.ops.tpcomm_c.all_gather, moved, self.c_handle,
                                      self.world_size)
        else:
            gathered = torch.ops.tpcomm.all_gather(moved, self.handle)
        return from_dim0(gathered, self.world_size, moved.shape, dim)

    def gather(self, x, dst=0, dim=-1):
        """Every rank's `x` concatenated along `dim` (the last by default) on rank `dst`, None on
        the others, as SGLang's `gather`."""
        moved, dim = to_dim0(x, dim)
        gathered = torch.ops.tpcomm.gather(moved, self.handle, dst)
        if self.rank_in_group != dst:
            return None
        return from_dim0(gathered, self.world_size, moved.shape, dim)

    def reduce_scatter(self, x, op="sum"):
        """This rank's block (along dimension 0) of the reduction of `x` over every rank."""
        if _extension is not None:
            return _compiled_call(torch.ops.tpcomm_c.reduce_scatter, x, self.c_handle,
                                  self.world_size, reduce_op(op))
        return torch.ops.tpcomm.reduce_scatter(x, self.handle, reduce_op(op))

    def all_to_all_single(self, x, counts=None):
        return torch.ops.tpcomm.all_to_all(x, self.handle, counts)

    def fused_all_reduce_add_rmsnorm(self, x, residual, gamma, eps, fp8_scale=None,
                                     fp8_row_scales=False, fp8_group_scales=False,
                                     gamma_plus_one=False):
        return torch.ops.tpcomm.all_reduce_add_rmsnorm(x, residual, gamma, eps, self.handle,
                                                       fp8_scale, fp8_row_scales,
                                                       fp8_group_scales, gamma_plus_one)

    def fused_reduce_scatter_add_rmsnorm(self, x, residual, gamma, eps, fp8_scale=None,
                                         fp8_row_scales=False, fp8_group_scales=False,
                                         gamma_plus_one=False):
        return torch.ops.tpcomm.reduce_scatter_add_rmsnorm(x, residual, gamma, eps, self.handle,
                                                           fp8_scale, fp8_row_scales,
                                                           fp8_group_scales, gamma_plus_one)

    def moe_finalize_all_reduce_add_rmsnorm(self, experts, map, weights, shared, residual, gamma,
                                            eps, fp8_scale=None, fp8_row_scales=False,
                                            fp8_group_scales=False, gamma_plus_one=False):
        return torch.ops.tpcomm.moe_finalize_all_reduce_add_rmsnorm(
            experts, map, weights, shared, residual, gamma, eps, self.handle, fp8_scale,
            fp8_row_scales, fp8_group_scales, gamma_plus_one)

    def lm_head_exchange(self, shard_logits, vocab, rows, rows_per_rank=None):
        return torch.ops.tpcomm.lm_head_exchange(shard_logits, self.handle, vocab, rows,
                                                 rows_per_rank)

    # In place, eager (like torch.distributed's): not ops.

    def broadcast(self, x, src=0):
        """`x` of rank `src` into `x` on every rank; returns `x`."""
        _check(x, "x", "broadcast", self.group)
        self.group.broadcast(_desc(x), _desc(x), src, _stream(x.device))
        return x

    def send(self, x, dst=None):
        """Sends `x` to rank `dst` (default: the next rank), as SGLang's `send`."""
        _check(x, "x", "send", self.group)
        dst = (self.rank_in_group + 1) % self.world_size if dst is None else dst
        self.group.send(_desc(x), dst, _stream(x.device))

    def recv(self, size, dtype=None, src=None):
        """Receives from rank `src` (default: the previous rank) into a new tensor of `size` and
        `dtype`, as SGLang's `recv`, or into `size` itself when it is a tensor; returns it."""
        x = size if isinstance(size, torch.Tensor) else torch.empty(size, dtype=dtype,
                                                                    device=self.device)
        _check(x, "x", "recv", self.group)
        src = (self.rank_in_group - 1) % self.world_size if src is None else src
        self.group.recv(_desc(x), src, _stream(x.device))
        return x

    def barrier(self):
        """Returns when every rank of the group has called it (through the store, as SGLang's
        barrier goes through its CPU group); queued GPU work is not waited for."""
        self.bootstrap.barrier()

    def prepare_exchange(self, bytes_per_peer=0):
        self.group.prepare_exchange(bytes_per_peer, _stream(self.device))

    @contextlib.contextmanager
    def graph_capture(self, stream=None):
        """Opens tpcomm's capture scope on `stream` (default: a new side stream, which it
        yields) for the CUDA graphs captured inside:

            with group.graph_capture() as stream:
                with torch.cuda.graph(graph, stream=stream):
                    ...

        Leaving it (after the capture ended) registers the captured buffers with every rank:
        every rank must capture the same calls. Nested on the same stream (a second group's
        context inside the first's, or this group's inside itself, as SGLang nests its groups'
        contexts), the inner one joins the outer scope."""
        if stream is None:
            stream = torch.cuda.Stream(self.device)
        if self._capture_stream is not None:
            if stream != self._capture_stream:
                raise RuntimeError("tpcomm: graph_capture is open on another stream already")
            with torch.cuda.stream(stream):
                yield stream
            return
        # The side stream must see the work queued so far, as torch.cuda.graph does.
        stream.wait_stream(torch.cuda.current_stream(self.device))
        self._capture_stream = stream
        try:
            with self.group.capture(stream.cuda_stream):
                with torch.cuda.stream(stream):
                    yield stream
        finally:
            self._capture_stream = None
