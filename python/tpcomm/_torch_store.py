# SPDX-License-Identifier: Apache-2.0
"""tpcomm's bootstrap over torch.distributed's own store (`tpcomm.torch.bootstrap_from_torch`)."""
import os
import threading

import tpcomm

_torch_worlds = {}  # the default process group -> the world bootstrap over its store
_torch_splits = {}  # (the default process group, a group's name) -> how often it was split
_torch_lock = threading.Lock()


def _torch_distributed_initialized():
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def bootstrap_from_torch(group=None, timeout_ms=0):
    """A `tpcomm.Bootstrap` for the ranks of a `torch.distributed` process group (the default
    group when None), over torch.distributed's own store: no store or port of tpcomm's own.

    The world's bootstrap is made once per process over the default group's store (a
    collective of every rank, the first time); a narrower group is a split of it (a local step),
    tagged with the group's name, so that the TP, attention-TP and MoE groups an engine made
    with `new_group` each get theirs. Every member of a group calls this for it, in the same
    order. Without tpcomm's own store there is no rank watch: see docs/RELIABILITY.md."""
    import torch.distributed as dist

    if not _torch_distributed_initialized():
        raise RuntimeError("tpcomm: torch.distributed is not initialized (call "
                           "init_process_group first, or build a tpcomm.Bootstrap)")
    default = dist.group.WORLD
    with _torch_lock:
        world = _torch_worlds.get(default)
        if world is None:
            env = os.environ
            local = (int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])) if (
                "LOCAL_RANK" in env and "LOCAL_WORLD_SIZE" in env) else (-1, -1)
            world = tpcomm.Bootstrap.from_store(
                dist.distributed_c10d._get_default_store(), dist.get_rank(),
                dist.get_world_size(), *local, timeout_ms=timeout_ms)
            _torch_worlds[default] = world
        if group is None or group is default:
            return world
        ranks = dist.get_process_group_ranks(group)
        name = str(group.group_name).replace("/", "_")
        n = _torch_splits.get((default, name), 0)
        _torch_splits[(default, name)] = n + 1
    return world.split(ranks, f"torch.{name}.{n}")
