# SPDX-License-Identifier: Apache-2.0
"""What `Bootstrap` and `Group` share: an object of the C API behind a handle, and the calls that
may block for long, made interruptible by Ctrl-C."""
import threading

from . import _capi
from ._errors import InvalidArgumentError, _check
from ._threads import _OnThread


def _interruptible(call, owner=None):
    """The status of `call()`, a C call that may block for a long time (waiting for peers or a
    key), and the C API's thread-local message when it failed, made so that Ctrl-C interrupts it
    within about 50 ms: Python runs its signal handlers only between bytecodes, never while a C
    call is blocked. So from the main thread the call runs on a worker thread while the main
    thread waits in slices, where KeyboardInterrupt can land; the abandoned call then ends by
    itself at its own deadline, and `owner`, the handle it uses, is never destroyed (that would
    free what the call still uses): it is left to the process's exit. Other threads call it
    directly."""

    def attempt():
        status = call()
        message = None if status == 0 else _capi.lib().tpcomm_last_error().decode(errors="replace")
        return status, message

    if threading.current_thread() is not threading.main_thread():
        return attempt()
    worker = _OnThread(attempt, "tpcomm-blocking-call")
    try:
        while not worker.wait(0.05):
            pass
    except BaseException:
        if owner is not None and not worker.done():
            owner._abandoned = True
        raise
    return worker.result()


class _Handle:
    """An object of the C API behind an opaque handle: `_kind` names it ("bootstrap", "group"),
    and `tpcomm_<kind>_last_error` / `tpcomm_<kind>_destroy` are its error text and destructor."""

    _kind = ""
    _handle = None

    @property
    def handle(self):
        if self._handle is None:
            raise InvalidArgumentError(2, f"the {self._kind} is closed")
        return self._handle

    def _call(self, status):
        if status != 0:
            last_error = getattr(_capi.lib(), f"tpcomm_{self._kind}_last_error")
            _check(status, last_error(self._handle).decode(errors="replace"))

    def close(self):
        """Releases the handle (not one a call interrupted by Ctrl-C still uses: `_interruptible`)."""
        if getattr(self, "_abandoned", False):
            self._handle = None
        if self._handle is not None:
            getattr(_capi.lib(), f"tpcomm_{self._kind}_destroy")(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the module may be gone
            pass
