# SPDX-License-Identifier: Apache-2.0
"""A stand-in for `tpcomm.torch.TpcommGroup` on the CPU: its dimension-0 operations, computed
from every rank's tensors gathered over gloo, so that the engine adapters' conventions are
tested without a GPU. It shares no code with the adapters."""
import contextlib

import torch
import torch.distributed as dist

from tpcomm.torch import reduce_op

_REDUCE = {"sum": lambda ts: sum(ts[1:], ts[0].clone()),
           "prod": lambda ts: torch.stack(ts).prod(0),
           "max": lambda ts: torch.stack(ts).amax(0),
           "min": lambda ts: torch.stack(ts).amin(0)}


class GlooNative:
    def __init__(self, group=None):
        self.group = group if group is not None else dist.group.WORLD
        self.ranks = dist.get_process_group_ranks(self.group)
        self.world_size = len(self.ranks)
        self.rank_in_group = self.ranks.index(dist.get_rank())
        self.device = torch.device("cpu")
        self.captures = []  # the streams graph_capture was opened on, innermost last
        self.closed = False
        self.aborted = False
        self.pending = []  # sends in flight

    def _everyone(self, x):
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return parts

    def all_reduce(self, x, op="sum"):
        return _REDUCE[reduce_op(op)](self._everyone(x))

    def all_gather(self, x, dim):
        assert dim == 0
        parts = self._everyone(x)
        return torch.cat(parts) if x.dim() > 0 else torch.stack(parts)

    def gather(self, x, dst, dim):
        assert dim == 0
        parts = self._everyone(x)
        return torch.cat(parts) if self.rank_in_group == dst else x.new_empty((0, *x.shape[1:]))

    def reduce_scatter(self, x, op="sum"):
        assert x.shape[0] % self.world_size == 0
        return self.all_reduce(x, op).chunk(self.world_size)[self.rank_in_group].clone()

    def all_to_all_single(self, x, counts=None):
        w, me = self.world_size, self.rank_in_group
        flats = [p.reshape(-1) for p in self._everyone(x.reshape(-1))] if counts is None else None
        if counts is None:
            n = x.numel() // w
            return torch.cat([f[me * n:(me + 1) * n] for f in flats]).reshape(x.shape)
        # Unequal: pad every rank's flat input to the longest, then cut rank s's block for me.
        sent = [sum(counts[s * w:(s + 1) * w]) for s in range(w)]
        padded = x.reshape(-1).new_zeros(max(sent))
        padded[: x.numel()] = x.reshape(-1)
        flats = self._everyone(padded)
        out = []
        for s in range(w):
            start = sum(counts[s * w:s * w + me])
            out.append(flats[s][start:start + counts[s * w + me]])
        return torch.cat(out)

    def broadcast(self, x, src):
        dist.broadcast(x, self.ranks[src], group=self.group)
        return x

    def send(self, x, dst):
        # tpcomm's send is ordered on the stream, not waited for by the host: isend.
        self.pending.append(dist.isend(x.clone(), self.ranks[dst], group=self.group))

    def recv(self, x, src):
        dist.recv(x, self.ranks[src], group=self.group)
        return x

    def barrier(self):
        for work in self.pending:
            work.wait()
        self.pending.clear()
        dist.barrier(group=self.group)

    @contextlib.contextmanager
    def graph_capture(self, stream=None):
        stream = stream if stream is not None else object()
        self.captures.append(stream)
        try:
            yield stream
        finally:
            self.captures.pop()

    def health(self):
        if self.aborted:
            raise RuntimeError("stand-in: aborted")

    def abort(self):
        self.aborted = True

    def close(self):
        self.barrier()
        self.closed = True
