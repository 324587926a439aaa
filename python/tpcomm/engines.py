# SPDX-License-Identifier: Apache-2.0
"""Communicators with the calling conventions of the inference engines, over tpcomm:

- `SglangCommunicator`: the device-communication methods and attributes of SGLang's
  `GroupCoordinator` (`sglang.srt.distributed.parallel_state`);
- `VllmCommunicator`: those of vLLM's `DeviceCommunicatorBase`
  (`vllm.distributed.device_communicators.base_device_communicator`).

Both are built from the engine's own torch.distributed process groups (`cpu_group`, and
`device_group` if it has one), with the group's ranks taken from torch.distributed's store (no
store or port of tpcomm's own), and run every collective through a `tpcomm.torch.TpcommGroup`
(`native`). docs/ENGINES.md maps them method by method. Their differences are the engines':
SGLang's `reduce_scatter` takes `(output, input_list)`, vLLM's `(input_, dim=-1)`; SGLang's
variable-size gathers and scatters work along dimension 0, vLLM's take a `dim`.

Keyword arguments past `native` are TpcommGroup's group options: an engine serving
deterministic inference (SGLang's `--enable-deterministic-inference`, vLLM's batch-invariant
mode) passes `deterministic="on"` (or "strict"; docs/DETERMINISM.md), as
`TPCOMM_DETERMINISTIC` would set it for every group.

The `native` object is anything with TpcommGroup's dimension-0 operations (`all_reduce`,
`all_gather(x, 0)`, `gather(x, dst, 0)`, `reduce_scatter`, `all_to_all_single`, `broadcast`,
`send`, `recv`, `barrier`, `graph_capture`, `close`, `world_size`, `rank_in_group`, `device`);
the tests give a stand-in over gloo to check the conventions without a GPU.
"""
import contextlib
import dataclasses
import os
from typing import List, Optional, Union

import torch
import torch.distributed as dist

from .torch import TpcommGroup, bootstrap_from_torch, from_dim0, to_dim0

__all__ = ["GraphCaptureContext", "SglangCommunicator", "VllmCommunicator"]


@dataclasses.dataclass
class GraphCaptureContext:
    """What `graph_capture` yields, as SGLang's: the stream the graphs are captured on."""

    stream: torch.cuda.Stream


def _rows(sizes, world, what):
    if sizes is None:
        return None
    sizes = [int(s) for s in sizes]
    if len(sizes) != world or any(s < 0 for s in sizes):
        raise ValueError(f"tpcomm: {what} sizes {sizes} must be {world} counts >= 0, one a rank")
    return sizes


class _Communicator:
    """What SGLang's and vLLM's communicators share: their attributes and the calls that they
    spell alike."""

    def __init__(self, cpu_group=None, device=None, device_group=None, unique_name="",
                 native=None, **group_options):
        self.cpu_group = cpu_group if cpu_group is not None else dist.group.WORLD
        self.device_group = device_group
        self.unique_name = unique_name
        self.ranks = dist.get_process_group_ranks(self.cpu_group)
        self.rank = dist.get_rank()
        self.world_size = len(self.ranks)
        self.rank_in_group = self.ranks.index(self.rank)
        if native is None:
            native = TpcommGroup(device, bootstrap_from_torch(self.cpu_group), **group_options)
        if (native.world_size, native.rank_in_group) != (self.world_size, self.rank_in_group):
            raise ValueError(f"tpcomm: the native group is rank {native.rank_in_group} of "
                             f"{native.world_size}, the process group rank "
                             f"{self.rank_in_group} of {self.world_size}")
        self.native = native
        self.device = native.device
        self.local_size = int(os.environ.get("LOCAL_SIZE", "0"))
        self.local_rank = (self.device.index if self.device.index is not None
                           else int(os.environ.get("LOCAL_RANK", self.rank)))

    # Neighbours, as SGLang's GroupCoordinator names them.
    @property
    def first_rank(self):
        return self.ranks[0]

    @property
    def last_rank(self):
        return self.ranks[-1]

    @property
    def is_first_rank(self):
        return self.rank == self.first_rank

    @property
    def is_last_rank(self):
        return self.rank == self.last_rank

    @property
    def next_rank(self):
        return self.ranks[(self.rank_in_group + 1) % self.world_size]

    @property
    def prev_rank(self):
        return self.ranks[(self.rank_in_group - 1) % self.world_size]

    def all_reduce(self, input_, op=dist.ReduceOp.SUM):
        """The sum (or `op`) of `input_` over the group, in a new tensor (`input_` itself on one
        rank, as both engines)."""
        if self.world_size == 1:
            return input_
        return self.native.all_reduce(input_, op)

    def all_gather(self, input_, dim=-1, output_tensor_list=None):
        """Every rank's `input_` concatenated along `dim`; with `output_tensor_list` (SGLang),
        rank r's `input_` copied into its entry r instead, and None returned."""
        if output_tensor_list is not None:
            if len(output_tensor_list) != self.world_size:
                raise ValueError(f"tpcomm: output_tensor_list has {len(output_tensor_list)} "
                                 f"tensors for {self.world_size} ranks")
            gathered = self.native.all_gather(input_.contiguous(), 0)
            for out, part in zip(output_tensor_list, gathered.chunk(self.world_size)):
                out.copy_(part.view(out.shape))
            return None
        if self.world_size == 1:
            return input_
        moved, dim = to_dim0(input_, dim)
        gathered = self.native.all_gather(moved, 0)
        return from_dim0(gathered, self.world_size, moved.shape, dim)

    def _all_gatherv(self, input_, dim, sizes):
        """Along `dim`, rank r contributing `sizes[r]` entries (all equal when None): padded to
        the largest, gathered, and cut."""
        if isinstance(input_, (list, tuple)):
            return [self._all_gatherv(t, dim, sizes) for t in input_]
        sizes = _rows(sizes, self.world_size, "all_gatherv")
        moved, dim = to_dim0(input_, dim)
        if sizes is not None and moved.shape[0] != sizes[self.rank_in_group]:
            raise ValueError(f"tpcomm: all_gatherv: this rank has {moved.shape[0]} entries "
                             f"along dim {dim}, sizes say {sizes[self.rank_in_group]}")
        if sizes is None or len(set(sizes)) == 1:
            return from_dim0(self.native.all_gather(moved, 0), self.world_size, moved.shape,
                             dim)
        most = max(sizes)
        padded = moved.new_zeros((most, *moved.shape[1:]))
        padded[: moved.shape[0]] = moved
        blocks = self.native.all_gather(padded, 0).chunk(self.world_size)
        gathered = torch.cat([b[:n] for b, n in zip(blocks, sizes)])
        return gathered if dim == 0 else gathered.movedim(0, dim)

    def _reduce_scatterv(self, input_, dim, sizes):
        """Rank r's `sizes[r]` entries along `dim` of the sum over ranks (equal blocks when
        None)."""
        sizes = _rows(sizes, self.world_size, "reduce_scatterv")
        moved, dim = to_dim0(input_, dim)
        if sizes is None or len(set(sizes)) == 1:
            out = self.native.reduce_scatter(moved, dist.ReduceOp.SUM)
        else:
            if sum(sizes) != moved.shape[0]:
                raise ValueError(f"tpcomm: reduce_scatterv: sizes {sizes} add up to "
                                 f"{sum(sizes)}, input has {moved.shape[0]} along dim {dim}")
            start = sum(sizes[: self.rank_in_group])
            out = self.native.all_reduce(moved, dist.ReduceOp.SUM)[
                start: start + sizes[self.rank_in_group]]
        return out if dim == 0 else out.movedim(0, dim).contiguous()

    def gather(self, input_, dst=0, dim=-1):
        """Every rank's `input_` concatenated along `dim` on the group's rank `dst`; None on
        the others."""
        moved, dim = to_dim0(input_, dim)
        gathered = self.native.gather(moved, dst, 0)
        if self.rank_in_group != dst:
            return None
        return from_dim0(gathered, self.world_size, moved.shape, dim)

    def broadcast(self, input_, src=0):
        """The group's rank `src`'s `input_` into `input_` on every rank; returns it."""
        if self.world_size == 1:
            return input_
        return self.native.broadcast(input_, src)

    def send(self, tensor, dst=None):
        """Sends `tensor` to the group's rank `dst` (default: the next one)."""
        dst = (self.rank_in_group + 1) % self.world_size if dst is None else dst
        self.native.send(tensor.contiguous(), dst)

    def recv(self, size, dtype, src=None):
        """A new tensor of `size` and `dtype` received from the group's rank `src` (default:
        the previous one)."""
        src = (self.rank_in_group - 1) % self.world_size if src is None else src
        x = torch.empty(size, dtype=dtype, device=self.device)
        self.native.recv(x, src=src)
        return x

    def barrier(self):
        """Returns when every rank of the group has called it."""
        self.native.barrier()

    @contextlib.contextmanager
    def graph_capture(self, graph_capture_context: Optional[GraphCaptureContext] = None,
                      stream=None):
        """tpcomm's capture scope around the CUDA graphs captured inside, on the stream of
        `graph_capture_context` (SGLang's nesting: a second group's context inside the first's
        reuses its stream), else on `stream` or a new one; yields the context:

            with tp.graph_capture() as ctx, attn_tp.graph_capture(ctx):
                with torch.cuda.graph(graph, stream=ctx.stream):
                    ...
        """
        if graph_capture_context is not None:
            stream = graph_capture_context.stream
        with self.native.graph_capture(stream) as s:
            yield (graph_capture_context if graph_capture_context is not None
                   else GraphCaptureContext(s))

    def health(self):
        """Raises the group's failure (a `tpcomm.TpcommError`: a lost rank, a kernel that gave up,
        ranks that called different collectives or are out of step, an NCCL error or timeout),
        if it has failed; returns None while the group is healthy. A watchdog notices failures
        without being asked (`TPCOMM_ASYNC_ERROR_HANDLING`); this is how to ask."""
        self.native.health()

    def abort(self):
        """Makes every waiting kernel, tpcomm's and NCCL's, give up and every later call raise.
        Safe from any thread (an engine's own watchdog); not collective: every rank must abort
        or fail alike."""
        self.native.abort()

    def destroy(self):
        """Releases the group (its buffers and communicators); later calls raise."""
        if self.native is not None:
            self.native.close()
            self.native = None


class SglangCommunicator(_Communicator):
    """SGLang's `GroupCoordinator`, its device communication: `all_reduce`, `all_gather`
    (`dim`, `output_tensor_list`), `all_gather_into_tensor`, `all_gatherv`, `reduce_scatter`
    (`output`, `input_list`), `reduce_scatter_tensor`, `reduce_scatterv`, `all_to_all_single`,
    `gather`, `broadcast`, `send`, `recv`, `barrier`, `graph_capture`, `destroy`; the attributes
    `rank`, `ranks`, `world_size`, `rank_in_group`, `local_rank`, `device`, `unique_name`,
    `cpu_group`, `device_group` and the neighbours (`first_rank`, `next_rank`, ...)."""

    def all_gather_into_tensor(self, output, input):  # noqa: A002 - SGLang's name
        """Every rank's `input` concatenated along dimension 0, into `output`."""
        if output.numel() != input.numel() * self.world_size:
            raise ValueError(f"tpcomm: all_gather_into_tensor: output has {output.numel()} "
                             f"elements, not {self.world_size} x {input.numel()}")
        output.copy_(self.native.all_gather(input.contiguous(), 0).view(output.shape))

    def all_gatherv(self, input_: Union[torch.Tensor, List[torch.Tensor]],
                    sizes: Optional[List[int]] = None, output: Optional[torch.Tensor] = None):
        """Along dimension 0, rank r contributing `sizes[r]` rows (all equal when None); a list
        of tensors gathers each. Returns a list (one tensor per input), as SGLang's; with
        `output` (a single input only), the result is copied into it."""
        inputs = list(input_) if isinstance(input_, (list, tuple)) else [input_]
        if output is not None and len(inputs) != 1:
            raise ValueError("tpcomm: all_gatherv: output is for a single input tensor")
        results = [self._all_gatherv(t, 0, sizes) for t in inputs]
        if output is not None:
            output.copy_(results[0].view(output.shape))
            results[0] = output
        return results

    def reduce_scatter_along_dim(self, input_, dim=-1):
        """This rank's block along `dim` of the sum of `input_` over the group (`input_` itself
        on one rank)."""
        if self.world_size == 1:
            return input_
        return self._reduce_scatterv(input_, dim, None)

    def reduce_scatter_tensor(self, output, input):  # noqa: A002 - SGLang's name
        """This rank's block (along dimension 0) of the sum of `input` over the group, into
        `output`."""
        output.copy_(self.native.reduce_scatter(input.contiguous(), dist.ReduceOp.SUM)
                     .view(output.shape))

    def reduce_scatter(self, output, input_list):
        """The sum over the group of every rank's `input_list[this rank]`, into `output`;
        returns `output`."""
        if len(input_list) != self.world_size:
            raise ValueError(f"tpcomm: reduce_scatter: input_list has {len(input_list)} "
                             f"tensors for {self.world_size} ranks")
        stacked = torch.stack([t.reshape(output.shape) for t in input_list])
        output.copy_(self.native.reduce_scatter(stacked, dist.ReduceOp.SUM).view(output.shape))
        return output

    def reduce_scatterv(self, input_, output=None, sizes=None):
        """This rank's `sizes[rank]` rows (equal blocks when None) of the sum of `input_` over
        the group; into `output` when given; returns it."""
        out = self._reduce_scatterv(input_, 0, sizes)
        if output is None:
            return out
        output.copy_(out.view(output.shape))
        return output

    def all_to_all_single(self, output, input,  # noqa: A002 - torch's and SGLang's names
                          output_split_sizes=None, input_split_sizes=None):
        """As `torch.distributed.all_to_all_single` (SGLang's takes equal blocks only; the
        split sizes are torch's, a superset): block d of `input` (along dimension 0,
        `input_split_sizes[d]` rows, or equal blocks) to rank d, and into `output` the blocks
        from every rank in rank order (`output_split_sizes[s]` rows from rank s). Unequal
        splits learn the other ranks' splits first (a synchronising step: eager only)."""
        w = self.world_size
        if input_split_sizes is None and output_split_sizes is None:
            result = self.native.all_to_all_single(input.contiguous())
            output.copy_(result.view(output.shape))
            return
        row = input[0].numel() if input.dim() > 0 and input.shape[0] > 0 else (
            output[0].numel() if output.dim() > 0 and output.shape[0] > 0 else 1)
        sent = _rows(input_split_sizes, w, "input_split") or [input.shape[0] // w] * w
        mine = torch.tensor(sent, dtype=torch.int64, device=self.device)
        matrix = self.native.all_gather(mine, 0).tolist()  # rows: senders
        received = [matrix[s * w + self.rank_in_group] for s in range(w)]
        if output_split_sizes is not None and _rows(output_split_sizes, w,
                                                    "output_split") != received:
            raise ValueError(f"tpcomm: all_to_all_single: output_split_sizes "
                             f"{list(output_split_sizes)} but the ranks send {received}")
        counts = [c * row for c in matrix]
        result = self.native.all_to_all_single(input.contiguous().view(-1), counts)
        output.copy_(result.view(output.shape))


class VllmCommunicator(_Communicator):
    """vLLM's `DeviceCommunicatorBase`: `all_reduce`, `all_gather(input_, dim=-1)`,
    `all_gatherv(input_, dim=0, sizes)`, `reduce_scatter(input_, dim=-1)`,
    `reduce_scatterv(input_, dim=-1, sizes)`, `gather(input_, dst=0, dim=-1)`, `send`, `recv`,
    `destroy`, `prepare_communication_buffer_for_model`, `dispatch`, `combine`; the attributes
    `rank`, `world_size`, `ranks`, `rank_in_group`, `global_rank`, `global_world_size`,
    `device`, `unique_name`, `cpu_group`, `device_group`. Constructed as vLLM constructs its
    communicators: `VllmCommunicator(cpu_group, device, device_group, unique_name)`."""

    def __init__(self, cpu_group=None, device=None, device_group=None, unique_name="",
                 native=None, **group_options):
        super().__init__(cpu_group, device, device_group, unique_name, native,
                         **group_options)
        self.global_rank = dist.get_rank()
        self.global_world_size = dist.get_world_size()
        self.use_all2all = False
        self.all2all_manager = None

    def all_gatherv(self, input_, dim=0, sizes=None):
        """Along `dim`, rank r contributing `sizes[r]` entries (all equal when None); a list of
        tensors gathers each."""
        return self._all_gatherv(input_, dim, sizes)

    def reduce_scatter(self, input_, dim=-1):
        """This rank's block along `dim` of the sum of `input_` over the group (`input_` itself
        on one rank)."""
        if self.world_size == 1:
            return input_
        return self._reduce_scatterv(input_, dim, None)

    def reduce_scatterv(self, input_, dim=-1, sizes=None):
        """This rank's `sizes[rank]` entries along `dim` (equal blocks when None) of the sum of
        `input_` over the group."""
        return self._reduce_scatterv(input_, dim, sizes)

    def prepare_communication_buffer_for_model(self, model):
        """Nothing to prepare: tpcomm's buffers are made with the group."""

    def dispatch(self, hidden_states, router_logits):
        return hidden_states, router_logits

    def combine(self, hidden_states):
        return hidden_states
