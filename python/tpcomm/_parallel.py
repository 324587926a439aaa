# SPDX-License-Identifier: Apache-2.0
"""SGLang's parallel groups (`tpcomm_parallel_layout`, `tpcomm_parallel_groups_create`)."""
import ctypes

from . import Group, _capi, _check, _int

KINDS = ("tp", "attn_tp", "moe_ep", "moe_tp")


def _config(world_size, tp_size, dp_size, enable_dp_attention, attn_cp_size, moe_ep_size,
            moe_dp_size):
    tp_size = world_size if tp_size is None else tp_size
    return _capi.CParallelConfig(
        _int("tp_size", tp_size), _int("dp_size", dp_size), int(bool(enable_dp_attention)),
        _int("attn_cp_size", attn_cp_size), _int("moe_ep_size", moe_ep_size),
        _int("moe_dp_size", moe_dp_size))


def parallel_layout(world_size, tp_size=None, dp_size=1, enable_dp_attention=False,
                    attn_cp_size=1, moe_ep_size=1, moe_dp_size=1):
    """The groups SGLang's `initialize_model_parallel` makes on `world_size` ranks with these
    flags (`tp_size` defaults to the world): {"tp", "attn_tp", "moe_ep", "moe_tp"} -> every group
    of that kind, each a list of global ranks in group-rank order, in creation order. Pure: use it
    to make the engine's own `torch.distributed` groups match tpcomm's."""
    config = _config(world_size, tp_size, dp_size, enable_dp_attention, attn_cp_size,
                     moe_ep_size, moe_dp_size)
    lib = _capi.lib()
    ranks = (ctypes.c_int * max(world_size, 1))()
    count = ctypes.c_size_t()
    layout = {}
    for kind, name in enumerate(KINDS):
        groups = []
        for rank in range(world_size):
            _check(lib.tpcomm_parallel_layout(world_size, ctypes.byref(config), kind, rank, ranks,
                                              len(ranks), ctypes.byref(count), None))
            group = list(ranks[: count.value])
            if group not in groups:
                groups.append(group)
        layout[name] = groups
    return layout


class ParallelGroups:
    """This rank's SGLang groups over the bootstrap `world` on CUDA device `device`
    (`tpcomm::ParallelGroups`): `tp`, `attn_tp`, `moe_ep`, `moe_tp`, each a `tpcomm.Group`.
    Sub-groups are splits of `world` (its store; no second port); a kind laid out like TP is
    TP's group (the same object here). Collective over `world`."""

    def __init__(self, world, device, tp_size=None, dp_size=1, enable_dp_attention=False,
                 attn_cp_size=1, moe_ep_size=1, moe_dp_size=1):
        config = _config(world.world_size, tp_size, dp_size, enable_dp_attention, attn_cp_size,
                         moe_ep_size, moe_dp_size)
        handles = (ctypes.c_void_p * len(KINDS))()
        status = _capi.lib().tpcomm_parallel_groups_create(world.handle, _int("device", device),
                                                           ctypes.byref(config), handles)
        if status != 0:
            world._call(status)
        made = {}
        for name, handle in zip(KINDS, handles):
            group = Group.__new__(Group)
            group._adopt(ctypes.c_void_p(handle))
            made[name] = group
        # A kind laid out like TP shares TP's communicator: one object for both.
        layout = parallel_layout(world.world_size, config.tp_size, dp_size, enable_dp_attention,
                                 attn_cp_size, moe_ep_size, moe_dp_size)
        for name in KINDS[1:]:
            if layout[name] == layout["tp"]:
                made[name].close()
                made[name] = made["tp"]
        self.tp, self.attn_tp, self.moe_ep, self.moe_tp = (made[k] for k in KINDS)

    def close(self):
        """Destroys the groups (not collective)."""
        for group in {id(g): g for g in (self.tp, self.attn_tp, self.moe_ep, self.moe_tp)}.values():
            group.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
