# SPDX-License-Identifier: Apache-2.0
"""`torch.ops.tpcomm.moe_finalize_all_reduce_add_rmsnorm`: the end of a tensor-parallel MoE
layer (the combine, then the fused all-reduce + residual add + RMSNorm), registered when
`tpcomm.torch` is imported."""
from typing import Optional, Tuple

import torch

from tpcomm._torch_common import (_FP8_GROUP, _check, _desc, _fused_checks, _fused_outputs,
                                  _stream, get_group)


def _moe_checks(experts, map, weights, shared, residual, gamma, group, fp8_scale,
                fp8_row_scales, fp8_group_scales):
    g = get_group(group)
    op = "moe_finalize_all_reduce_add_rmsnorm"
    for t, name in ((experts, "experts"), (map, "map"), (weights, "weights"), (shared, "shared")):
        if t is not None:
            _check(t, name, op, g)
    if experts.dim() != 2 or map.dim() != 2 or map.dtype != torch.int32:
        raise ValueError(f"tpcomm::{op}: experts must be [rows, hidden] and map int32 "
                         f"[tokens, top_k] (they are {tuple(experts.shape)} and "
                         f"{tuple(map.shape)} {map.dtype})")
    x_shape = (map.shape[0], experts.shape[1])
    x = experts.new_empty((0,))  # only its dtype and device: the shape checks use `x_shape`
    _fused_checks(x, residual, gamma, group, fp8_scale, fp8_row_scales, fp8_group_scales)
    if fp8_group_scales and x_shape[1] % _FP8_GROUP != 0:
        raise ValueError(f"tpcomm::{op}: fp8_group_scales takes a hidden size that is a multiple "
                         f"of {_FP8_GROUP} ({x_shape[1]})")
    return g, x_shape


@torch.library.custom_op("tpcomm::moe_finalize_all_reduce_add_rmsnorm", mutates_args=())
def moe_finalize_all_reduce_add_rmsnorm(
        experts: torch.Tensor, map: torch.Tensor, weights: torch.Tensor,
        shared: Optional[torch.Tensor], residual: Optional[torch.Tensor], gamma: torch.Tensor,
        eps: float, group: int, fp8_scale: Optional[torch.Tensor] = None,
        fp8_row_scales: bool = False, fp8_group_scales: bool = False,
        gamma_plus_one: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The end of a tensor-parallel MoE layer: x[t] = sum over k of weights[t, k] *
    experts[map[t, k]] + shared[t] (`experts` [rows, hidden], int32 `map` and `weights` [tokens,
    top_k], `shared` [tokens, hidden] or None), then `all_reduce_add_rmsnorm` of x, with its
    outputs and forms."""
    g, shape = _moe_checks(experts, map, weights, shared, residual, gamma, group, fp8_scale,
                           fp8_row_scales, fp8_group_scales)
    norm_out, residual_out, scales = _fused_outputs(experts, fp8_scale, fp8_row_scales,
                                                    fp8_group_scales, shape)
    g.moe_finalize_all_reduce_add_rmsnorm(
        _desc(experts), _desc(map), _desc(weights), None if shared is None else _desc(shared),
        None if residual is None else _desc(residual), _desc(gamma), eps, _desc(norm_out),
        _desc(residual_out), fp8_scale=None if fp8_scale is None else _desc(fp8_scale),
        fp8_row_scales=_desc(scales) if fp8_row_scales else None,
        fp8_group_scales=_desc(scales) if fp8_group_scales else None,
        gamma_plus_one=gamma_plus_one, stream=_stream(experts.device))
    return norm_out, residual_out, scales


@moe_finalize_all_reduce_add_rmsnorm.register_fake
def _(experts, map, weights, shared, residual, gamma, eps, group, fp8_scale=None,
      fp8_row_scales=False, fp8_group_scales=False, gamma_plus_one=False):
    _, shape = _moe_checks(experts, map, weights, shared, residual, gamma, group, fp8_scale,
                           fp8_row_scales, fp8_group_scales)
    return _fused_outputs(experts, fp8_scale, fp8_row_scales, fp8_group_scales, shape)
