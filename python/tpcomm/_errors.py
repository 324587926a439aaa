# SPDX-License-Identifier: Apache-2.0
"""The exceptions of tpcomm's failing calls, one per `tpcomm_status`, and the raise of one."""
import builtins

from . import _capi


class TpcommError(RuntimeError):
    """A failed tpcomm call: `status` is the `tpcomm_status` code, `status_name` its name, and the
    message is the library's."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = _capi.lib().tpcomm_status_string(status).decode()
        super().__init__(f"{message} [{self.status_name}]")


class UnsupportedError(TpcommError):
    """No backend can serve the request."""


class InvalidArgumentError(TpcommError, ValueError):
    """A bad argument: nothing was done, the handle stays usable."""


class CudaError(TpcommError):
    """A CUDA call failed."""


class NcclError(TpcommError):
    """NCCL failed; the group is unusable."""


class TimeoutError(TpcommError, builtins.TimeoutError):  # noqa: A001
    """A peer did not arrive within TPCOMM_TIMEOUT_MS (or the timeout given)."""


class AbortedError(TpcommError):
    """The group was aborted."""


class UnavailableError(TpcommError):
    """A component is missing on this machine (driver, NCCL, peer access)."""


class MismatchError(TpcommError):
    """The ranks called different collectives at the same point; the group is unusable."""


_ERRORS = {
    1: UnsupportedError,
    2: InvalidArgumentError,
    3: CudaError,
    4: NcclError,
    5: TimeoutError,
    6: AbortedError,
    7: UnavailableError,
    11: MismatchError,
}


def _check(status, message=None):
    """Raises the exception of a non-zero status, with the C API's message."""
    if status != 0:
        if message is None:
            message = _capi.lib().tpcomm_last_error().decode(errors="replace")
        raise _ERRORS.get(status, TpcommError)(status, message)
