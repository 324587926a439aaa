# SPDX-License-Identifier: Apache-2.0
"""What the PyTorch ops of `tpcomm.torch` and `tpcomm._torch_moe` share: the table of groups
(the ops' int handles), the checks and C API views of tensors, and the fused calls' checks and
outputs."""
import itertools
import threading

import torch

import tpcomm

_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
}
for _name, _tpcomm in (("uint32", "uint32"), ("uint64", "uint64"),
                       ("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _tpcomm

# ---- the table of groups --------------------------------------------------------------------

_groups = {}
_groups_lock = threading.Lock()
_next_handle = itertools.count(1)


def register_group(group):
    """Enters a `tpcomm.Group` in the table; returns its handle (an int) for the ops."""
    with _groups_lock:
        handle = next(_next_handle)
        _groups[handle] = group
    return handle


def unregister_group(handle):
    with _groups_lock:
        _groups.pop(handle, None)


def get_group(handle):
    """The `tpcomm.Group` of a handle; ValueError for an unknown one."""
    group = _groups.get(handle)
    if group is None:
        raise ValueError(f"tpcomm: no group has handle {handle} (closed, or never registered)")
    return group


# ---- tensors ----------------------------------------------------------------------------------


def _check(t, name, op, group):
    """Raises a clear error for a tensor the op cannot take: unsupported dtype, not contiguous,
    not on the group's GPU. Runs in the fake implementations too (tracing reports it)."""
    if t.dtype not in _DTYPES:
        raise TypeError(f"tpcomm::{op}: {name} has dtype {t.dtype}, which tpcomm does not "
                        f"support (supported: {', '.join(str(d) for d in _DTYPES)})")
    if not t.is_contiguous():
        raise ValueError(f"tpcomm::{op}: {name} is not contiguous (shape {tuple(t.shape)}, "
                         f"strides {t.stride()}): pass {name}.contiguous()")
    if t.device.type != "cuda" or (t.device.index is not None and t.device.index != group.device):
        raise ValueError(f"tpcomm::{op}: {name} is on {t.device}, but the group's GPU is "
                         f"cuda:{group.device}")
    if t.dim() > 6:
        raise ValueError(f"tpcomm::{op}: {name} has {t.dim()} dimensions; at most 6")


def _desc(t):
    """The C API's tensor for `t` (checked by `_check` before)."""
    return tpcomm.tensor(t.data_ptr(), _DTYPES[t.dtype], t.shape, t.device.index)


def _stream(device):
    return torch.cuda.current_stream(device).cuda_stream


# ---- the fused calls --------------------------------------------------------------------------

_FP8_GROUP = 128  # elements per scale of the per-group FP8 form


def _fused_checks(x, residual, gamma, group, fp8_scale, fp8_row_scales, fp8_group_scales):
    g = get_group(group)
    op = "all_reduce_add_rmsnorm"
    for t, name in ((x, "x"), (residual, "residual"), (gamma, "gamma"), (fp8_scale, "fp8_scale")):
        if t is not None:
            _check(t, name, op, g)
    if (fp8_scale is not None) + fp8_row_scales + fp8_group_scales > 1:
        raise ValueError(f"tpcomm::{op}: give one of fp8_scale, fp8_row_scales and "
                         "fp8_group_scales")
    if fp8_group_scales and (x.dim() == 0 or x.shape[-1] % _FP8_GROUP != 0):
        raise ValueError(f"tpcomm::{op}: fp8_group_scales takes a last dimension that is a "
                         f"multiple of {_FP8_GROUP} (x has shape {tuple(x.shape)})")
    return g


def _fused_outputs(x, fp8_scale, fp8_row_scales, fp8_group_scales, shape=None):
    """The outputs of a fused call on x, or on an x of `shape` in `x`'s dtype and device."""
    shape = tuple(x.shape) if shape is None else tuple(shape)
    fp8 = fp8_scale is not None or fp8_row_scales or fp8_group_scales
    if fp8 and not hasattr(torch, "float8_e4m3fn"):
        raise TypeError("tpcomm::all_reduce_add_rmsnorm: this PyTorch has no float8_e4m3fn")
    norm_out = x.new_empty(shape, dtype=torch.float8_e4m3fn if fp8 else x.dtype)
    hidden = shape[-1] if shape else 0
    rows = (norm_out.numel() // hidden) if hidden > 0 else 0
    if fp8_group_scales:
        scales = (rows, hidden // _FP8_GROUP)
    else:
        scales = (rows if fp8_row_scales else 0,)
    return norm_out, x.new_empty(shape), x.new_empty(scales, dtype=torch.float32)
