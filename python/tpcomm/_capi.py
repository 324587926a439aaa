# SPDX-License-Identifier: Apache-2.0
"""ctypes declarations of the C API (include/tpcomm/tpcomm.h) and the library's loading."""
import ctypes
import importlib.util
import os
import threading

MAX_DIMS = 6


class CTensor(ctypes.Structure):
    """`tpcomm_tensor`: a contiguous tensor in device memory."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
    ]


# The callbacks of `tpcomm_store_ops`.
STORE_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.c_int64)
STORE_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.c_int64)
STORE_ADD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                             ctypes.POINTER(ctypes.c_int64), ctypes.c_int64)
STORE_FLAG = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p,
                              ctypes.POINTER(ctypes.c_int), ctypes.c_int64)


class CStoreOps(ctypes.Structure):
    """`tpcomm_store_ops`."""

    _fields_ = [
        ("ctx", ctypes.c_void_p),
        ("set", STORE_SET),
        ("get", STORE_GET),
        ("add", STORE_ADD),
        ("check", STORE_FLAG),
        ("erase", STORE_FLAG),
    ]


class CRankInfo(ctypes.Structure):
    """`tpcomm_rank_info`."""

    _fields_ = [
        ("rank", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
        ("local_rank", ctypes.c_int32),
        ("local_world_size", ctypes.c_int32),
        ("node_id", ctypes.c_int32),
        ("device", ctypes.c_int32),
    ]


class CParallelConfig(ctypes.Structure):
    """`tpcomm_parallel_config`."""

    _fields_ = [(name, ctypes.c_int32) for name in (
        "tp_size", "dp_size", "enable_dp_attention", "attn_cp_size", "moe_ep_size",
        "moe_dp_size")]


class CGroupConfig(ctypes.Structure):
    """`tpcomm_group_config`."""

    _fields_ = [
        ("custom_all_reduce", ctypes.c_int32),
        ("nccl", ctypes.c_int32),
        ("fusion", ctypes.c_int32),
        ("deterministic", ctypes.c_int32),
        ("fusion_max_tokens", ctypes.c_int64),
        ("fusion_hidden", ctypes.c_int64),
    ]


#: `tpcomm_determinism`: whether a group's all-reduces and fused norms are batch-invariant
#: (None: TPCOMM_DETERMINISTIC decides; docs/DETERMINISM.md).
DETERMINISM = {None: 0, "off": 1, False: 1, "on": 2, True: 2, "strict": 3}


def determinism(value):
    """`value` (a key of DETERMINISM) as a `tpcomm_determinism`; ValueError for anything else."""
    if value not in DETERMINISM:
        raise ValueError(f"tpcomm: deterministic={value!r} is not one of None, False, True, "
                         "'off', 'on', 'strict'")
    return DETERMINISM[value]


#: `tpcomm_failure_fn`: void (*)(int status, const char* message, void* user).
FAILURE_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

_h = ctypes.c_void_p
_p = ctypes.c_void_p
_t = ctypes.POINTER(CTensor)
_i = ctypes.c_int
_i64 = ctypes.c_int64
_sz = ctypes.c_size_t
_s = ctypes.c_char_p

# name: (argument types); every function returns a status (int) unless listed in _STRINGS.
_SIGNATURES = {
    "tpcomm_version": [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_i)],
    "tpcomm_info": [_i, _s, _sz, ctypes.POINTER(_sz), ctypes.POINTER(_i)],
    "tpcomm_bootstrap_from_env": [ctypes.POINTER(_h)],
    "tpcomm_bootstrap_create": [_i, _i, _i, _i, _s, _i, ctypes.POINTER(_h)],
    "tpcomm_bootstrap_from_store": [ctypes.POINTER(CStoreOps), _i, _i, _i, _i, _i64,
                                    ctypes.POINTER(_h)],
    "tpcomm_bootstrap_split": [_h, ctypes.POINTER(_i), _sz, _s, ctypes.POINTER(_h)],
    "tpcomm_bootstrap_destroy": [_h],
    "tpcomm_bootstrap_rank_info": [_h, ctypes.POINTER(CRankInfo)],
    "tpcomm_bootstrap_barrier": [_h],
    "tpcomm_store_set": [_h, _s, _p, _sz, _i64],
    "tpcomm_store_get": [_h, _s, _p, _sz, ctypes.POINTER(_sz), _i64],
    "tpcomm_store_add": [_h, _s, _i64, ctypes.POINTER(_i64), _i64],
    "tpcomm_store_check": [_h, _s, ctypes.POINTER(_i), _i64],
    "tpcomm_store_erase": [_h, _s, ctypes.POINTER(_i), _i64],
    "tpcomm_group_create": [_h, _i, ctypes.POINTER(CGroupConfig), ctypes.POINTER(_h)],
    "tpcomm_group_destroy": [_h],
    "tpcomm_parallel_layout": [_i, ctypes.POINTER(CParallelConfig), _i, _i, ctypes.POINTER(_i),
                               _sz, ctypes.POINTER(_sz), ctypes.POINTER(_i)],
    "tpcomm_parallel_groups_create": [_h, _i, ctypes.POINTER(CParallelConfig),
                                      ctypes.POINTER(_h)],
    "tpcomm_group_rank_info": [_h, ctypes.POINTER(CRankInfo)],
    "tpcomm_group_health": [_h],
    "tpcomm_group_abort": [_h],
    "tpcomm_group_set_failure_mode": [_h, _i, FAILURE_FN, _p],
    "tpcomm_group_tune": [_h],
    "tpcomm_group_warm_up": [_h, _p],
    "tpcomm_group_backend_for": [_h, _i, _t, _t, _i, _s, _sz],
    "tpcomm_all_reduce": [_h, _t, _t, _i, _p],
    "tpcomm_all_gather": [_h, _t, _t, _p],
    "tpcomm_reduce_scatter": [_h, _t, _t, _i, _p],
    "tpcomm_all_to_all": [_h, _t, _t, _p],
    "tpcomm_all_to_all_counts": [_h, _t, _t, ctypes.POINTER(_i64), _sz, _p],
    "tpcomm_broadcast": [_h, _t, _t, _i, _p],
    "tpcomm_gather": [_h, _t, _t, _i, _p],
    "tpcomm_send": [_h, _t, _i, _p],
    "tpcomm_recv": [_h, _t, _i, _p],
    "tpcomm_all_reduce_add_rmsnorm": [_h, _t, _t, _t, ctypes.c_float, _t, _t, _t, _t, _t, _i,
                                      _p],
    "tpcomm_reduce_scatter_add_rmsnorm": [_h, _t, _t, _t, ctypes.c_float, _t, _t, _t, _t, _t,
                                          _i, _p],
    "tpcomm_add_rmsnorm": [_t, _t, _t, ctypes.c_float, _t, _t, _t, _t, _t, _i, _p],
    "tpcomm_moe_finalize_all_reduce_add_rmsnorm": [_h, _t, _t, _t, _t, _t, _t, ctypes.c_float, _t,
                                                   _t, _t, _t, _t, _i, _p],
    "tpcomm_moe_combine": [_t, _t, _t, _t, _t, _p],
    "tpcomm_lm_head_exchange": [_h, _t, _t, _i64, ctypes.POINTER(_i64), _sz, _p],
    "tpcomm_prepare_exchange": [_h, _i64, _p],
    "tpcomm_capture_begin": [_h, _p, ctypes.POINTER(_h)],
    "tpcomm_capture_end": [_h],
}
# name: (argument types) of the functions that return nothing.
_VOIDS = {
    "tpcomm_store_callback_error": [_s],
}
_STRINGS = {
    "tpcomm_status_string": [_i],
    "tpcomm_last_error": [],
    "tpcomm_bootstrap_last_error": [_h],
    "tpcomm_group_last_error": [_h],
}

_lock = threading.Lock()
_lib = None


def library_path():
    """The libtpcomm.so to load: $TPCOMM_LIBRARY, else the one inside this package."""
    explicit = os.environ.get("TPCOMM_LIBRARY")
    if explicit:
        return explicit
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libtpcomm.so")


def _prefer_pytorchs_nccl():
    """Where PyTorch's NCCL (the `nvidia-nccl` wheel) is installed and TPCOMM_NCCL_PATH is not
    set, points tpcomm at it: a process holds one libnccl.so.2 (the loader reuses a loaded
    soname), and PyTorch needs its own, whichever of the two loads NCCL first."""
    if os.environ.get("TPCOMM_NCCL_PATH"):
        return
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.exists(candidate):
            os.environ["TPCOMM_NCCL_PATH"] = candidate
            return


def lib():
    """The loaded library, with every function's signature declared (loaded once)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            _prefer_pytorchs_nccl()
            path = library_path()
            if not os.path.exists(path):
                raise ImportError(
                    f"tpcomm: the C library {path} does not exist (install the package with "
                    "'pip install .', or set TPCOMM_LIBRARY to a built libtpcomm.so)"
                )
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                raise ImportError(f"tpcomm: cannot load {path}: {e}") from e
            for name, args in _SIGNATURES.items():
                fn = getattr(handle, name)
                fn.argtypes = args
                fn.restype = ctypes.c_int
            for name, args in _VOIDS.items():
                fn = getattr(handle, name)
                fn.argtypes = args
                fn.restype = None
            for name, args in _STRINGS.items():
                fn = getattr(handle, name)
                fn.argtypes = args
                fn.restype = ctypes.c_char_p
            _lib = handle
    return _lib
