# SPDX-License-Identifier: Apache-2.0
"""`tpcomm_store_ops` over an application's store (`Bootstrap.from_store`)."""
import builtins
import ctypes
import time

from . import _capi

# Every `StoreCallbacks` made, kept for the life of the process: the C side holds their function
# pointers in every bootstrap, sub-bootstrap and group made from them.
_KEPT = []


class StoreCallbacks:
    """`tpcomm_store_ops` over a `torch.distributed.Store`-like object. A callback never raises
    into C: a failure is a status (TPCOMM_TIMEOUT for a wait that ran out)."""

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

    def _guard(self, body):
        try:
            body()
            return 0
        except builtins.TimeoutError:
            return self._TIMEOUT
        except BaseException:  # noqa: BLE001 - a status for C, never an exception
            return self._SYSTEM_ERROR

    def _set(self, _ctx, key, value, size, _timeout_ms):
        return self._guard(lambda: self.store.set(key.decode(), ctypes.string_at(value, size)))

    def _get(self, _ctx, key, buf, capacity, size, timeout_ms):
        def body():
            k = key.decode()
            deadline = time.monotonic() + timeout_ms / 1000
            pause = 0.0005
            # Polled with check(): a wait() that runs out raises a different error in each
            # store, and check() never blocks.
            while not self.store.check([k]):
                if time.monotonic() >= deadline:
                    raise builtins.TimeoutError(k)
                time.sleep(pause)
                pause = min(2 * pause, 0.01)
            value = bytes(self.store.get(k))
            size[0] = len(value)
            if buf and len(value) <= capacity:
                ctypes.memmove(buf, value, len(value))
        return self._guard(body)

    def _add(self, _ctx, key, delta, result, _timeout_ms):
        def body():
            result[0] = int(self.store.add(key.decode(), delta))
        return self._guard(body)

    def _check(self, _ctx, key, exists, _timeout_ms):
        def body():
            exists[0] = 1 if self.store.check([key.decode()]) else 0
        return self._guard(body)

    def _erase(self, _ctx, key, existed, _timeout_ms):
        def body():
            existed[0] = 1 if self.store.delete_key(key.decode()) else 0
        return self._guard(body)
