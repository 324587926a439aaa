# SPDX-License-Identifier: Apache-2.0
"""`tpcomm_store_ops` over an application's store (`Bootstrap.from_store`)."""
import builtins
import ctypes
import time

from . import _capi
from ._threads import _OnThread

# Every `StoreCallbacks` made, kept for the life of the process: the C side holds their function
# pointers in every bootstrap, sub-bootstrap and group made from them.
_KEPT = []

_INT64 = (-(1 << 63), (1 << 63) - 1)


class _Abandoned(builtins.TimeoutError):
    """A call of the store's that did not return within its timeout (left running)."""


class _WrongType(TypeError):
    """A store method that returned a value of the wrong type."""


def _bounded(fn, timeout_ms, what):
    """`fn()`, a call of the application's store, run where it can be abandoned: on a thread of
    its own, waited for at most `timeout_ms`. A store whose call blocks (a get that waits for a
    key, a server that stopped answering) would otherwise hold the C call past every deadline;
    abandoned, the call ends by itself or with the process (the thread is a daemon), and what it
    does after that is the store's."""
    call = _OnThread(fn, "tpcomm-store-call")
    if not call.wait(max(timeout_ms, 1) / 1000):
        raise _Abandoned(f"the store's {what} did not return within {timeout_ms} ms")
    return call.result()


class StoreCallbacks:
    """`tpcomm_store_ops` over a `torch.distributed.Store`-like object. A callback never raises
    into C: a failure is a status (TPCOMM_TIMEOUT for a wait that ran out) and its text, handed
    to the library (`tpcomm_store_callback_error`) so that the error raised names it. Every call
    of the store is bounded by the callback's timeout (`_bounded`), and what it returns is checked:
    `get` gives bytes, `add` an int of 64 bits."""

    _TIMEOUT = 5
    _SYSTEM_ERROR = 8

    def __init__(self, store):
        for method in ("set", "get", "add", "check", "delete_key"):
            if not callable(getattr(store, method, None)):
                raise TypeError(f"the store has no {method}() (a torch.distributed.Store has)")
        self.store = store
        self.ops = _capi.CStoreOps(None, _capi.STORE_SET(self._set), _capi.STORE_GET(self._get),
                                   _capi.STORE_ADD(self._add), _capi.STORE_FLAG(self._check),
                                   _capi.STORE_FLAG(self._erase))
        _KEPT.append(self)

    @staticmethod
    def _guard(body):
        try:
            body()
            return 0
        except _Abandoned as e:
            StoreCallbacks._tell(str(e))
            return StoreCallbacks._TIMEOUT
        except builtins.TimeoutError:
            return StoreCallbacks._TIMEOUT  # the key was not set in time: the library says so
        except _WrongType as e:
            StoreCallbacks._tell(str(e))
            return StoreCallbacks._SYSTEM_ERROR
        except BaseException as e:  # noqa: BLE001 - a status for C, never an exception
            StoreCallbacks._tell(f"{type(e).__name__}: {e}")
            return StoreCallbacks._SYSTEM_ERROR

    @staticmethod
    def _tell(text):
        _capi.lib().tpcomm_store_callback_error(text.encode(errors="replace"))

    def _call(self, method, timeout_ms, *args):
        fn = getattr(self.store, method)
        shown = ", ".join(repr(a) for a in args if not isinstance(a, bytes))
        return _bounded(lambda: fn(*args), timeout_ms, f"{method}({shown})")

    def _set(self, _ctx, key, value, size, timeout_ms):
        return self._guard(
            lambda: self._call("set", timeout_ms, key.decode(), ctypes.string_at(value, size)))

    def _get(self, _ctx, key, buf, capacity, size, timeout_ms):
        def body():
            k = key.decode()
            deadline = time.monotonic() + timeout_ms / 1000
            pause = 0.0005
            # Polled with check(): a wait() that runs out raises a different error in each
            # store, and check() never blocks.
            while not self._call("check", self._left(deadline), [k]):
                if time.monotonic() >= deadline:
                    raise builtins.TimeoutError(k)
                time.sleep(pause)
                pause = min(2 * pause, 0.01)
            value = self._call("get", self._left(deadline), k)
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise _WrongType(f"the store's get({k!r}) returned {type(value).__name__}, "
                                 "not bytes")
            value = bytes(value)
            size[0] = len(value)
            if buf and len(value) <= capacity:
                ctypes.memmove(buf, value, len(value))
        return self._guard(body)

    @staticmethod
    def _left(deadline):
        return max(int((deadline - time.monotonic()) * 1000), 1)

    def _add(self, _ctx, key, delta, result, timeout_ms):
        def body():
            k = key.decode()
            n = self._call("add", timeout_ms, k, delta)
            if isinstance(n, bool) or not isinstance(n, int):
                raise _WrongType(f"the store's add({k!r}, {delta}) returned "
                                 f"{type(n).__name__}, not int")
            if not _INT64[0] <= n <= _INT64[1]:
                raise _WrongType(f"the store's add({k!r}, {delta}) returned {n}, outside "
                                 "64 bits")
            result[0] = n
        return self._guard(body)

    def _check(self, _ctx, key, exists, timeout_ms):
        def body():
            exists[0] = 1 if self._call("check", timeout_ms, [key.decode()]) else 0
        return self._guard(body)

    def _erase(self, _ctx, key, existed, timeout_ms):
        def body():
            existed[0] = 1 if self._call("delete_key", timeout_ms, key.decode()) else 0
        return self._guard(body)
