# SPDX-License-Identifier: Apache-2.0
"""The compiled eager path of `tpcomm.torch`: `tpcomm_torch_ext` (python/torch_ext), where
installed, initialised with the C API of the library loaded here."""
import ctypes
import os
import re

import tpcomm
from tpcomm import _capi


def _load_extension():
    """`tpcomm_torch_ext` (python/torch_ext, a package of its own, built against this PyTorch),
    initialised with the C API of the library loaded here; None where it is not installed or
    TPCOMM_TORCH_EXT=0."""
    if os.environ.get("TPCOMM_TORCH_EXT", "1") == "0":
        return None
    try:
        import tpcomm_torch_ext
    except ImportError:
        return None
    lib = _capi.lib()

    def address(name):
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value

    tpcomm_torch_ext.init(address("tpcomm_all_reduce"), address("tpcomm_all_gather"),
                          address("tpcomm_reduce_scatter"), address("tpcomm_last_error"))
    return tpcomm_torch_ext


extension = _load_extension()
_STATUS = re.compile(r"\[status (\d+)\]")


def compiled():
    """True when the eager calls of `TpcommGroup` go through the compiled ops
    (`torch.ops.tpcomm_c.*`)."""
    return extension is not None


def _compiled_call(op, *args):
    """`op(*args)` of `torch.ops.tpcomm_c`, with the C API's failures raised as tpcomm's
    exceptions (the same as the Python ops raise)."""
    try:
        return op(*args)
    except RuntimeError as e:
        status = _STATUS.search(str(e))
        if status is None:
            raise
        code = int(status.group(1))
        raise tpcomm._ERRORS.get(code, tpcomm.TpcommError)(code, str(e)) from None
