# SPDX-License-Identifier: Apache-2.0
"""tpcomm from Python: the C API (include/tpcomm/tpcomm.h) through ctypes.

Needs no PyTorch: `version`, `info`, `Bootstrap` (with its key-value store) and `Group` over raw
device pointers work anywhere libtpcomm.so loads. `tpcomm.torch` adds PyTorch ops.

Every failing call raises a `TpcommError` subclass (by status) carrying the library's message.
"""
import atexit
import contextlib
import ctypes
import json as _json
import weakref

from . import _capi, _store
from ._args import _int, _key, _pointer, _ref, _stream, _text, _value
from ._errors import (_ERRORS, AbortedError, CudaError, InvalidArgumentError,  # noqa: F401
                      MismatchError, NcclError, TimeoutError, TpcommError, UnavailableError,
                      UnsupportedError, _check)
from ._handle import _Handle, _interruptible

__all__ = [
    "AbortedError",
    "Bootstrap",
    "CudaError",
    "DTYPES",
    "Group",
    "InvalidArgumentError",
    "ParallelGroups",
    "NcclError",
    "REDUCE_OPS",
    "TimeoutError",
    "TpcommError",
    "UnavailableError",
    "UnsupportedError",
    "info",
    "parallel_layout",
    "tensor",
    "version",
]

#: Element types by name, with the numbering of `tpcomm_dtype`.
DTYPES = {
    "float32": 0,
    "float16": 1,
    "bfloat16": 2,
    "float64": 3,
    "int8": 4,
    "uint8": 5,
    "int32": 6,
    "uint32": 7,
    "int64": 8,
    "uint64": 9,
    "float8_e4m3fn": 10,
    "float8_e5m2": 11,
}
#: Reduction operators by name (`tpcomm_reduce_op`).
REDUCE_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
#: Operations `Group.backend_for` knows (`tpcomm_op`).
_OPS = {"all_reduce": 0, "all_reduce_add_rmsnorm": 1, "all_gather": 2, "all_to_all": 3,
        "moe_finalize": 4, "reduce_scatter_add_rmsnorm": 5}

#: What a group's watchdog does when the group fails (`tpcomm_failure_mode`).
FAILURE_MODES = {"raise": 0, "teardown": 1, "callback": 2}


def __getattr__(name):
    # `tpcomm.__version__`, read from the library (the one version, CMakeLists.txt's) when
    # asked, so that importing the package loads nothing.
    if name == "__version__":
        return version()
    raise AttributeError(f"module 'tpcomm' has no attribute {name!r}")


def version():
    """The library's version, "MAJOR.MINOR.PATCH"."""
    v = ctypes.c_char_p()
    _check(_capi.lib().tpcomm_version(ctypes.byref(v), None))
    return v.value.decode()


def info(as_json=False):
    """`tpcomm info`: the text report, or with `as_json` the parsed JSON object."""
    lib = _capi.lib()
    needed = ctypes.c_size_t()
    _check(lib.tpcomm_info(int(as_json), None, 0, ctypes.byref(needed), None))
    # Probed again for the text; leave room in case the machine's report grew in between.
    while True:
        buf = ctypes.create_string_buffer(needed.value + 4096)
        status = lib.tpcomm_info(int(as_json), buf, len(buf), ctypes.byref(needed), None)
        if status == 0:
            text = buf.value.decode(errors="replace")
            return _json.loads(text) if as_json else text
        if needed.value < len(buf):
            _check(status)


def tensor(data_ptr, dtype, shape, device=-1):
    """A `tpcomm_tensor`: a contiguous tensor at `data_ptr` (an int) of `dtype` (a name of
    `DTYPES`) and `shape` (a sequence of at most 6 extents) on CUDA device `device`."""
    if dtype not in DTYPES:
        raise InvalidArgumentError(2, f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    shape = tuple(_int("shape", d, 64) for d in shape)
    if len(shape) > _capi.MAX_DIMS:
        raise InvalidArgumentError(2, f"{len(shape)} dimensions; at most {_capi.MAX_DIMS}")
    t = _capi.CTensor()
    t.data = _pointer("data_ptr", data_ptr)
    t.dtype = DTYPES[dtype]
    t.ndim = len(shape)
    t.device = _int("device", device)
    for i, d in enumerate(shape):
        t.shape[i] = d
    return t


# Handles over an application's store (`Bootstrap.from_store`, its splits, groups built on them):
# their heartbeat thread calls into that store's Python methods, and a thread that Python ends
# inside such a call at shutdown cannot unwind through the C library. So they are closed before
# Python shuts down, groups first, which ends the thread while Python still serves it.
_STORE_BACKED = weakref.WeakSet()


@atexit.register
def _close_store_backed():
    for h in sorted(list(_STORE_BACKED), key=lambda h: not isinstance(h, Group)):
        try:
            h.close()
        except Exception:  # noqa: BLE001 - nothing to report at exit
            pass


def _track(handle, parent):
    if parent in _STORE_BACKED:
        _STORE_BACKED.add(handle)
    return handle


class Bootstrap(_Handle):
    """A rank's place in the job and the key-value store shared by its ranks.

    `Bootstrap()` reads the launcher's environment (torchrun, mpirun, srun, `tpcomm launch`,
    TPCOMM_*); `Bootstrap(rank=r, world_size=n, store_port=p)` takes explicit values (rank 0
    hosts the TCP store on `store_host`:`store_port`). Collective either way.
    """

    _kind = "bootstrap"

    def __init__(self, rank=None, world_size=None, local_rank=-1, local_world_size=-1,
                 store_host="127.0.0.1", store_port=0):
        lib = _capi.lib()
        handle = ctypes.c_void_p()
        if rank is None and world_size is None:
            _check(*_interruptible(lambda: lib.tpcomm_bootstrap_from_env(ctypes.byref(handle))))
        else:
            if rank is None or world_size is None:
                raise InvalidArgumentError(2, "give both rank and world_size, or neither")
            host = None if store_host is None else _text("store_host", store_host)
            args = (_int("rank", rank), _int("world_size", world_size),
                    _int("local_rank", local_rank), _int("local_world_size", local_world_size),
                    host, _int("store_port", store_port), ctypes.byref(handle))
            _check(*_interruptible(lambda: lib.tpcomm_bootstrap_create(*args)))
        self._adopt(handle)

    @classmethod
    def from_store(cls, store, rank, world_size, local_rank=-1, local_world_size=-1,
                   timeout_ms=0):
        """A bootstrap over the application's own store (no store or port of tpcomm's own):
        anything with the methods of a `torch.distributed.Store` that tpcomm uses — `set(key,
        value)`, `get(key)` (bytes), `add(key, amount)`, `check([key])`, `delete_key(key)` — such
        as the `TCPStore` or `PrefixStore` torchrun and the engines already have. Keys go under
        "tpcomm/". `local_rank`/`local_world_size` -1 derive locality from host names (then
        this is a collective). `timeout_ms` bounds every wait (0: TPCOMM_TIMEOUT_MS), the store's
        own calls included: each runs on a thread of its own, and one that has not returned in
        time is abandoned and fails the wait with a TimeoutError naming it. `get` must return
        bytes and `add` an int of 64 bits (anything else is refused naming the method); an
        exception the store raises is carried in the error. Without tpcomm's own store there is
        no rank watch: a dead peer is noticed at the deadline."""
        ops = _store.StoreCallbacks(store).ops
        args = (ctypes.byref(ops), _int("rank", rank), _int("world_size", world_size),
                _int("local_rank", local_rank), _int("local_world_size", local_world_size),
                _int("timeout_ms", timeout_ms, 64))
        handle = ctypes.c_void_p()
        lib = _capi.lib()
        _check(*_interruptible(lambda: lib.tpcomm_bootstrap_from_store(*args,
                                                                        ctypes.byref(handle))))
        boot = cls.__new__(cls)
        boot._adopt(handle)
        _STORE_BACKED.add(boot)
        return boot

    def _adopt(self, handle):
        lib = _capi.lib()
        self._handle = handle
        info = _capi.CRankInfo()
        _check(lib.tpcomm_bootstrap_rank_info(handle, ctypes.byref(info)))
        self.rank = info.rank
        self.world_size = info.world_size
        self.local_rank = info.local_rank
        self.local_world_size = info.local_world_size
        self.node_id = info.node_id

    def close(self):
        """Releases the handle (rank 0 stops the store after its peers disconnect, and after
        every bootstrap split from it is closed too)."""
        super().close()

    def split(self, ranks, tag):
        """A bootstrap for the sub-group `ranks` (ranks of this one, ascending, this rank among
        them) sharing this one's store: no second port, so the tensor-, attention- and
        expert-parallel groups of one job all come from it. Every member passes the same `tag`
        (non-empty, no '/'); its rank is this rank's index in `ranks`. Local, no communication."""
        if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
            raise TypeError(f"ranks must be a sequence of ints, not {type(ranks).__name__}")
        ranks = [_int("rank", r) for r in ranks]
        arr = (ctypes.c_int * max(len(ranks), 1))(*ranks)
        handle = ctypes.c_void_p()
        lib = _capi.lib()
        status = lib.tpcomm_bootstrap_split(self.handle, arr, len(ranks), _text("tag", tag),
                                            ctypes.byref(handle))
        _check(status, None if status == 0 else lib.tpcomm_last_error().decode(errors="replace"))
        sub = Bootstrap.__new__(Bootstrap)
        sub._adopt(handle)
        return _track(sub, self)

    def barrier(self):
        """Returns when every rank has called it."""
        lib, handle = _capi.lib(), self.handle
        self._call(_interruptible(lambda: lib.tpcomm_bootstrap_barrier(handle), self)[0])

    def store_set(self, key, value, timeout_ms=0):
        """Stores `value` (bytes or another bytes-like object, or a str as UTF-8) under `key`."""
        value = _value(value)
        self._call(_capi.lib().tpcomm_store_set(self.handle, _key(key), value, len(value),
                                                _int("timeout_ms", timeout_ms, 64)))

    def store_get(self, key, timeout_ms=0):
        """The value of `key` (bytes), waiting for it up to `timeout_ms` (0: TPCOMM_TIMEOUT_MS)."""
        lib = _capi.lib()
        handle, k, timeout_ms = self.handle, _key(key), _int("timeout_ms", timeout_ms, 64)
        size = ctypes.c_size_t(0)
        buf = ctypes.create_string_buffer(256)
        status, _ = _interruptible(
            lambda: lib.tpcomm_store_get(handle, k, buf, len(buf), ctypes.byref(size), timeout_ms),
            self)
        if status == 2 and size.value > len(buf):
            buf = ctypes.create_string_buffer(size.value)
            status = lib.tpcomm_store_get(handle, k, buf, len(buf), ctypes.byref(size),
                                          timeout_ms)
        self._call(status)
        return buf.raw[: size.value]

    def store_add(self, key, delta, timeout_ms=0):
        """Adds `delta` to the counter at `key` and returns the new value."""
        result = ctypes.c_int64()
        self._call(_capi.lib().tpcomm_store_add(self.handle, _key(key), _int("delta", delta, 64),
                                                ctypes.byref(result),
                                                _int("timeout_ms", timeout_ms, 64)))
        return result.value

    def store_check(self, key, timeout_ms=0):
        """True when `key` is set; does not wait."""
        exists = ctypes.c_int()
        self._call(_capi.lib().tpcomm_store_check(self.handle, _key(key), ctypes.byref(exists),
                                                  _int("timeout_ms", timeout_ms, 64)))
        return bool(exists.value)

    def store_erase(self, key, timeout_ms=0):
        """Removes `key`; True when it was set."""
        existed = ctypes.c_int()
        self._call(_capi.lib().tpcomm_store_erase(self.handle, _key(key), ctypes.byref(existed),
                                                  _int("timeout_ms", timeout_ms, 64)))
        return bool(existed.value)


class Group(_Handle):
    """A communicator over a bootstrap's ranks on CUDA device `device` (`tpcomm::Group`).

    Collectives take `tpcomm.tensor(...)` descriptors and a stream (a `cudaStream_t` as an int;
    0 is the legacy default stream). Collective on creation; every rank calls the same
    collectives in the same order. `tpcomm.torch` wraps it for PyTorch tensors.
    """

    _kind = "group"

    def __init__(self, bootstrap, device, custom_all_reduce=True, nccl=True, fusion=True,
                 fusion_max_tokens=0, fusion_hidden=0, deterministic=None):
        """`fusion_max_tokens` rows of `fusion_hidden` elements: the fused operation's largest
        batch (0: TPCOMM_FUSION_*). `deterministic`: batch-invariant reductions, "on", "strict",
        "off" (or True, False; None: TPCOMM_DETERMINISTIC decides; docs/DETERMINISM.md)."""
        config = _capi.CGroupConfig(int(custom_all_reduce), int(nccl), int(fusion),
                                    _capi.determinism(deterministic),
                                    _int("fusion_max_tokens", fusion_max_tokens, 64),
                                    _int("fusion_hidden", fusion_hidden, 64))
        handle = ctypes.c_void_p()
        status = _capi.lib().tpcomm_group_create(bootstrap.handle, _int("device", device),
                                                 ctypes.byref(config), ctypes.byref(handle))
        if status != 0:
            bootstrap._call(status)
        self._adopt(handle)
        _track(self, bootstrap)

    def _adopt(self, handle):
        self._handle = handle
        info = _capi.CRankInfo()
        self._call(_capi.lib().tpcomm_group_rank_info(handle, ctypes.byref(info)))
        self.rank = info.rank
        self.world_size = info.world_size
        self.device = info.device

    def close(self):
        """Destroys the group (not collective)."""
        super().close()

    @property
    def last_error(self):
        return _capi.lib().tpcomm_group_last_error(self.handle).decode(errors="replace")

    def health(self):
        """Raises the group's sticky failure, if any."""
        self._call(_capi.lib().tpcomm_group_health(self.handle))

    def abort(self):
        """Makes every waiting kernel give up and every later call raise AbortedError."""
        self._call(_capi.lib().tpcomm_group_abort(self.handle))

    def set_failure_mode(self, mode, callback=None):
        """What the group's watchdog does when the group fails (a lost rank, a kernel that gave
        up, ranks that called different collectives): "raise" marks it failed (the next call
        raises), "teardown" takes the process down, "callback" also calls
        `callback(error)` with the `TpcommError` on the watchdog's thread."""
        if mode not in FAILURE_MODES:
            raise InvalidArgumentError(2, f"failure mode {mode!r} is not one of "
                                          f"{sorted(FAILURE_MODES)}")
        fn = _capi.FAILURE_FN()
        if callback is not None:
            def fn_py(status, message, _user):
                error = _ERRORS.get(status, TpcommError)(
                    status, message.decode(errors="replace"))
                callback(error)
            fn = _capi.FAILURE_FN(fn_py)
        self._call(_capi.lib().tpcomm_group_set_failure_mode(self.handle, FAILURE_MODES[mode],
                                                             fn, None))
        self._failure_fn = fn  # kept alive while the library may call it

    def tune(self):
        """Measures the custom all-reduce per size and installs the table. Collective."""
        self._call(_capi.lib().tpcomm_group_tune(self.handle))

    def warm_up(self, stream=0):
        self._call(_capi.lib().tpcomm_group_warm_up(self.handle, _stream(stream)))

    def backend_for(self, op, inp, out, capturing=False):
        """Which path would serve `op` ("all_reduce", "all_reduce_add_rmsnorm", "all_gather",
        "all_to_all", "moe_finalize": `inp` its combine's output, "reduce_scatter_add_rmsnorm":
        `inp` all of x) for these tensors: "local", "custom_ar:<name>", "nccl", ..."""
        if op not in _OPS:
            raise InvalidArgumentError(2, f"op {op!r} is not one of {sorted(_OPS)}")
        buf = ctypes.create_string_buffer(128)
        self._call(_capi.lib().tpcomm_group_backend_for(self.handle, _OPS[op], _ref(inp),
                                                        _ref(out), int(capturing), buf,
                                                        len(buf)))
        return buf.value.decode()

    @staticmethod
    def _op(op):
        if op not in REDUCE_OPS:
            raise InvalidArgumentError(2, f"op {op!r} is not one of {sorted(REDUCE_OPS)}")
        return REDUCE_OPS[op]

    def all_reduce(self, inp, out, op="sum", stream=0):
        self._call(_capi.lib().tpcomm_all_reduce(self.handle, _ref(inp), _ref(out), self._op(op),
                                                 _stream(stream)))

    def all_gather(self, inp, out, stream=0):
        self._call(_capi.lib().tpcomm_all_gather(self.handle, _ref(inp), _ref(out), _stream(stream)))

    def gather(self, inp, out, root, stream=0):
        """Every rank's `inp` concatenated on rank `root` into `out` (None elsewhere will do)."""
        self._call(_capi.lib().tpcomm_gather(self.handle, _ref(inp), _ref(out),
                                             _int("root", root), _stream(stream)))

    def reduce_scatter(self, inp, out, op="sum", stream=0):
        self._call(_capi.lib().tpcomm_reduce_scatter(self.handle, _ref(inp), _ref(out),
                                                     self._op(op), _stream(stream)))

    def all_to_all(self, inp, out, counts=None, stream=0):
        """Equal split, or with `counts` (world_size^2 ints, `counts[s * world + d]` elements
        from rank s to rank d)."""
        lib = _capi.lib()
        if counts is None:
            self._call(lib.tpcomm_all_to_all(self.handle, _ref(inp), _ref(out), _stream(stream)))
        else:
            arr = (ctypes.c_int64 * len(counts))(*counts)
            self._call(lib.tpcomm_all_to_all_counts(self.handle, _ref(inp), _ref(out), arr,
                                                    len(counts), _stream(stream)))

    def broadcast(self, inp, out, root, stream=0):
        self._call(_capi.lib().tpcomm_broadcast(self.handle, _ref(inp), _ref(out),
                                                _int("root", root), _stream(stream)))

    def send(self, buf, peer, stream=0):
        self._call(_capi.lib().tpcomm_send(self.handle, _ref(buf), _int("peer", peer),
                                           _stream(stream)))

    def recv(self, buf, peer, stream=0):
        self._call(_capi.lib().tpcomm_recv(self.handle, _ref(buf), _int("peer", peer),
                                           _stream(stream)))

    def all_reduce_add_rmsnorm(self, x, residual, gamma, eps, norm_out, residual_out,
                               fp8_scale=None, fp8_row_scales=None, stream=0,
                               fp8_group_scales=None, gamma_plus_one=False):
        """`residual` None: none (residual_out is the sum). `gamma` in x's dtype or float32;
        `gamma_plus_one` scales by 1 + gamma (Gemma). An f8e4m3 `norm_out` takes one of
        `fp8_scale`, `fp8_row_scales` ([tokens]) and `fp8_group_scales` ([tokens, hidden / 128])."""
        self._call(_capi.lib().tpcomm_all_reduce_add_rmsnorm(
            self.handle, _ref(x), _ref(residual), _ref(gamma), eps, _ref(norm_out),
            _ref(residual_out), _ref(fp8_scale), _ref(fp8_row_scales), _ref(fp8_group_scales),
            1 if gamma_plus_one else 0, _stream(stream)))

    def reduce_scatter_add_rmsnorm(self, x, residual, gamma, eps, norm_out, residual_out,
                                   fp8_scale=None, fp8_row_scales=None, stream=0,
                                   fp8_group_scales=None, gamma_plus_one=False):
        """The sequence-parallel form of `all_reduce_add_rmsnorm`: `x` [tokens, hidden] summed
        over the ranks, this rank keeping its tokens / world rows (rank r the r-th share), then
        the residual add and RMSNorm on them; `residual`, `norm_out` and `residual_out` are
        [tokens / world, hidden]. The other arguments as `all_reduce_add_rmsnorm`'s."""
        self._call(_capi.lib().tpcomm_reduce_scatter_add_rmsnorm(
            self.handle, _ref(x), _ref(residual), _ref(gamma), eps, _ref(norm_out),
            _ref(residual_out), _ref(fp8_scale), _ref(fp8_row_scales), _ref(fp8_group_scales),
            1 if gamma_plus_one else 0, _stream(stream)))

    def moe_finalize_all_reduce_add_rmsnorm(self, experts, map, weights, shared, residual,
                                            gamma, eps, norm_out, residual_out, fp8_scale=None,
                                            fp8_row_scales=None, stream=0, fp8_group_scales=None,
                                            gamma_plus_one=False):
        """x = the MoE combine (`experts` [rows, hidden]; int32 `map` and `weights` [tokens,
        top_k]; `shared` [tokens, hidden] or None), then `all_reduce_add_rmsnorm` of x."""
        self._call(_capi.lib().tpcomm_moe_finalize_all_reduce_add_rmsnorm(
            self.handle, _ref(experts), _ref(map), _ref(weights), _ref(shared), _ref(residual),
            _ref(gamma), eps, _ref(norm_out), _ref(residual_out), _ref(fp8_scale),
            _ref(fp8_row_scales), _ref(fp8_group_scales), 1 if gamma_plus_one else 0,
            _stream(stream)))

    def lm_head_exchange(self, shard_logits, out, rows, stream=0):
        """`rows`: an int (every rank holds that many rows) or one count per rank."""
        lib = _capi.lib()
        if isinstance(rows, int):
            status = lib.tpcomm_lm_head_exchange(self.handle, _ref(shard_logits), _ref(out),
                                                 _int("rows", rows, 64), None, 0, _stream(stream))
        else:
            arr = (ctypes.c_int64 * len(rows))(*rows)
            status = lib.tpcomm_lm_head_exchange(self.handle, _ref(shard_logits), _ref(out), -1,
                                                 arr, len(rows), _stream(stream))
        self._call(status)

    def prepare_exchange(self, bytes_per_peer=0, stream=0):
        self._call(_capi.lib().tpcomm_prepare_exchange(self.handle, bytes_per_peer, _stream(stream)))

    @contextlib.contextmanager
    def capture(self, stream):
        """A capture scope: open it around a CUDA-graph capture on `stream`; leaving it (after
        the capture ended) registers the captured buffers with every rank. Collective."""
        lib = _capi.lib()
        scope = ctypes.c_void_p()
        self._call(lib.tpcomm_capture_begin(self.handle, _stream(stream), ctypes.byref(scope)))
        try:
            yield self
        finally:
            status = lib.tpcomm_capture_end(scope)
        self._call(status)


from ._parallel import ParallelGroups, parallel_layout  # noqa: E402 - needs Group
