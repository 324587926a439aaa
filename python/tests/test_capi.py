# SPDX-License-Identifier: Apache-2.0
"""The package through the C API, without a GPU or PyTorch: version, info, errors mapped to
exceptions with the library's message, the store of a single process, and a bootstrap of
several processes over the real TCP store."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import tpcomm
from conftest import free_port


def test_version_matches_the_project():
    v = tpcomm.version()
    assert v.count(".") == 2
    assert all(p.isdigit() for p in v.split("."))
    assert tpcomm.__version__ == v
    # One version source: CMakeLists.txt's project(), which pyproject.toml reads too.
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "CMakeLists.txt")) as f:
        assert f"project(tpcomm VERSION {v} " in f.read()
    with open(os.path.join(root, "pyproject.toml")) as f:
        assert 'dynamic = ["version"]' in f.read()


def test_backend_for_knows_the_c_operations():
    # NOTE [the operation table] (src/backends/op.hpp): Python's names and values are C's
    # `tpcomm_op`, which a cpu test checks against the library's table.
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "include", "tpcomm", "tpcomm.h")) as f:
        header = f.read()
    body = header[header.index("typedef enum tpcomm_op {"):header.index("} tpcomm_op;")]
    in_c = {m.group(1).lower(): int(m.group(2))
            for m in re.finditer(r"TPCOMM_OP_([A-Z0-9_]+) = ([0-9]+)", body)}
    assert in_c and tpcomm._OPS == in_c


def test_info_text_and_json():
    text = tpcomm.info()
    assert text.startswith("tpcomm " + tpcomm.version() + "\n")
    assert "\nCUDA driver: " in text
    assert "\nNCCL: " in text
    report = tpcomm.info(as_json=True)
    assert report["tpcomm"]["version"] == tpcomm.version()
    assert isinstance(report["driver"]["available"], bool)
    assert "TPCOMM_TIMEOUT_MS" in report["knobs"]


def test_info_never_shows_the_store_token():
    code = "import tpcomm, json; print(json.dumps(tpcomm.info(as_json=True)['knobs']))"
    env = dict(os.environ, TPCOMM_STORE_TOKEN="s3cr3t-token")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert "s3cr3t-token" not in out
    assert json.loads(out)["TPCOMM_STORE_TOKEN"] == "(set)"


def test_works_without_torch():
    code = textwrap.dedent("""
        import sys
        sys.modules['torch'] = None  # any import of torch fails
        import tpcomm
        tpcomm.info()
        with tpcomm.Bootstrap(rank=0, world_size=1) as b:
            b.store_set('k', b'v')
            assert b.store_get('k') == b'v'
        print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_bad_arguments_raise_with_the_c_message():
    with pytest.raises(tpcomm.InvalidArgumentError) as e:
        tpcomm.Bootstrap(rank=2, world_size=2, store_port=1234)
    assert "tpcomm_bootstrap_create: " in str(e.value)
    assert "rank 2 is outside 0..1" in str(e.value)
    assert e.value.status == 2 and e.value.status_name == "invalid argument"
    assert isinstance(e.value, ValueError)
    with pytest.raises(tpcomm.InvalidArgumentError, match="store_port 0 is outside 1..65535"):
        tpcomm.Bootstrap(rank=0, world_size=2, store_port=0)
    with pytest.raises(tpcomm.InvalidArgumentError, match="both rank and world_size"):
        tpcomm.Bootstrap(rank=0)
    with pytest.raises(tpcomm.InvalidArgumentError, match="dtype 'complex64'"):
        tpcomm.tensor(0, "complex64", [4])
    with pytest.raises(tpcomm.InvalidArgumentError, match="7 dimensions"):
        tpcomm.tensor(0, "float32", [1] * 7)


def test_arguments_are_checked_before_they_reach_c():
    # ctypes would wrap 2**32 + 1 to 1, and cut a string at a NUL.
    with pytest.raises(ValueError, match="rank 4294967297 is outside"):
        tpcomm.Bootstrap(rank=2**32 + 1, world_size=2, store_port=1234)
    with pytest.raises(TypeError, match="world_size must be an int, not str"):
        tpcomm.Bootstrap(rank=0, world_size="2", store_port=1234)
    with pytest.raises(TypeError, match="rank must be an int, not bool"):
        tpcomm.Bootstrap(rank=True, world_size=2, store_port=1234)
    with pytest.raises(ValueError, match="store_host .* holds a NUL"):
        tpcomm.Bootstrap(rank=0, world_size=2, store_host="127.0.0.1\0evil", store_port=1234)
    with pytest.raises(ValueError, match="device 4294967296 is outside"):
        tpcomm.tensor(0, "float32", [4], device=2**32)
    with tpcomm.Bootstrap(rank=0, world_size=1) as b:
        with pytest.raises(ValueError, match="holds a NUL character"):
            b.store_set("a\0b", b"x")
        with pytest.raises(TypeError, match="store keys are str, not bytes"):
            b.store_get(b"k")
        with pytest.raises(ValueError, match="delta 9223372036854775808 is outside"):
            b.store_add("n", 2**63)
        with pytest.raises(TypeError, match="timeout_ms must be an int"):
            b.store_get("k", timeout_ms=1.5)


def test_invalid_knob_names_its_variable():
    # The knobs are read when a bootstrap of several ranks starts.
    code = ("import tpcomm\n"
            "try:\n"
            "    tpcomm.Bootstrap(rank=0, world_size=2, store_port=1)\n"
            "except tpcomm.InvalidArgumentError as e:\n"
            "    print(e)\n")
    env = dict(os.environ, TPCOMM_TIMEOUT_MS="soon")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert "TPCOMM_TIMEOUT_MS" in out and "soon" in out


def test_store_of_one_process():
    with tpcomm.Bootstrap(rank=0, world_size=1) as b:
        assert (b.rank, b.world_size, b.local_rank, b.local_world_size) == (0, 1, 0, 1)
        b.barrier()
        big = bytes(range(256)) * 40  # larger than the first buffer store_get tries
        b.store_set("big", big)
        assert b.store_get("big") == big
        b.store_set("text", "hello")
        assert b.store_get("text") == b"hello"
        assert b.store_check("text")
        assert b.store_erase("text")
        assert not b.store_check("text")
        assert not b.store_erase("text")
        assert b.store_add("n", 5) == 5
        assert b.store_add("n", -7) == -2
        with pytest.raises(tpcomm.TimeoutError, match="missing") as e:
            b.store_get("missing", timeout_ms=100)
        assert isinstance(e.value, TimeoutError)
        with pytest.raises(tpcomm.InvalidArgumentError, match="key is NULL or empty"):
            b.store_set("", b"x")
    with pytest.raises(tpcomm.InvalidArgumentError, match="closed"):
        b.barrier()


RANK_SCRIPT = textwrap.dedent("""
    import sys
    import tpcomm
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    with tpcomm.Bootstrap(rank=rank, world_size=world, local_rank=rank, local_world_size=world,
                          store_port=port) as b:
        assert (b.rank, b.world_size, b.node_id) == (rank, world, 0)
        b.store_set(f"rank/{rank}", f"value of rank {rank}")
        b.store_add("arrivals", 1)
        b.barrier()
        assert b.store_add("arrivals", 0) == world
        for peer in range(world):
            assert b.store_get(f"rank/{peer}") == f"value of rank {peer}".encode()
        b.barrier()
    print("rank", rank, "ok")
""")


@pytest.mark.parametrize("world", [2, 3])
def test_bootstrap_of_processes_over_the_tcp_store(world):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(r), str(world), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outputs.append(out)
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r}:\n{out}"
        assert f"rank {r} ok" in out


SPLIT_SCRIPT = textwrap.dedent("""
    import sys
    import tpcomm
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    with tpcomm.Bootstrap(rank=rank, world_size=world, local_rank=rank, local_world_size=world,
                          store_port=port) as job:
        # Two partitions of the job at once, from the one store: pairs and a parity split.
        pair = job.split([r for r in range(world) if r // 2 == rank // 2], "pair")
        parity = job.split([r for r in range(world) if r % 2 == rank % 2], "parity")
        for sub, name in ((pair, "pair"), (parity, "parity")):
            sub.store_set(f"{name}/{sub.rank}", str(rank))
            sub.barrier()
            got = [int(sub.store_get(f"{name}/{r}")) for r in range(sub.world_size)]
            members = [r for r in range(world)
                       if (r // 2 == rank // 2 if name == "pair" else r % 2 == rank % 2)]
            assert got == members, (name, got, members)
            assert sub.rank == members.index(rank)
        try:
            job.split([r for r in range(world) if r != rank], "without me")
        except tpcomm.InvalidArgumentError as e:
            print("refused:", e)
        pair.close()
        parity.close()
        job.barrier()
    print("rank", rank, "ok")
""")


def test_sub_groups_share_the_job_store():
    world = 4
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", SPLIT_SCRIPT, str(r), str(world), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        assert p.returncode == 0, f"rank {r}:\n{out}"
        assert f"rank {r} ok" in out and "refused: tpcomm_bootstrap_split: " in out, out


def test_split_checks_its_arguments():
    with tpcomm.Bootstrap(rank=0, world_size=1) as b:
        with pytest.raises(TypeError, match="ranks must be a sequence"):
            b.split(0, "tp")
        with pytest.raises(TypeError, match="tag must be a str"):
            b.split([0], 7)
        with pytest.raises(tpcomm.InvalidArgumentError, match="ranks is NULL or empty"):
            b.split([], "tp")
        with b.split([0], "tp") as sub:
            assert (sub.rank, sub.world_size) == (0, 1)
            sub.barrier()


def test_a_missing_peer_times_out_with_a_message():
    code = ("import sys, tpcomm\n"
            "try:\n"
            "    tpcomm.Bootstrap(rank=1, world_size=2, store_port=int(sys.argv[1]))\n"
            "except tpcomm.TpcommError as e:\n"
            "    print(type(e).__name__, e)\n")
    env = dict(os.environ, TPCOMM_TIMEOUT_MS="500")
    out = subprocess.run([sys.executable, "-c", code, str(free_port())], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("TimeoutError tpcomm_bootstrap_create: "), out


def test_a_group_without_a_gpu_raises_the_library_error():
    if tpcomm.info(as_json=True)["gpus"]:
        pytest.skip("this machine has a GPU (the GPU tests build groups)")
    with tpcomm.Bootstrap(rank=0, world_size=1) as b:
        # No driver, or no device: unavailable, saying which, with no source path in it.
        with pytest.raises(tpcomm.UnavailableError,
                           match="tpcomm_group_create: no (usable NVIDIA driver|CUDA GPU)") as e:
            tpcomm.Group(b, 0)
        assert ".cpp:" not in str(e.value) and ".hpp:" not in str(e.value)
        with pytest.raises(tpcomm.InvalidArgumentError, match="device -1 is negative"):
            tpcomm.Group(b, -1)
        with pytest.raises(tpcomm.InvalidArgumentError, match="fusion_max_tokens -5 and"):
            tpcomm.Group(b, 0, fusion_max_tokens=-5)
        with pytest.raises(tpcomm.InvalidArgumentError, match="rows of 2 bytes are more than"):
            tpcomm.Group(b, 0, fusion_max_tokens=65536, fusion_hidden=65536)
        with pytest.raises(ValueError, match="fusion_hidden 9223372036854775808 is outside"):
            tpcomm.Group(b, 0, fusion_hidden=1 << 63)
        with pytest.raises(ValueError, match="deterministic='sometimes' is not one of"):
            tpcomm.Group(b, 0, deterministic="sometimes")


def test_group_determinism_is_the_c_numbering():
    # tpcomm_determinism: 0 the environment's, then off, on, strict.
    assert [tpcomm._capi.determinism(v) for v in (None, "off", "on", "strict")] == [0, 1, 2, 3]
    assert tpcomm._capi.determinism(True) == 2 and tpcomm._capi.determinism(False) == 1
    assert [f[0] for f in tpcomm._capi.CGroupConfig._fields_][3] == "deterministic"


def test_parallel_layout_is_sglangs():
    layout = tpcomm.parallel_layout(8, dp_size=2, enable_dp_attention=True, moe_ep_size=4)
    assert layout["tp"] == [list(range(8))]
    assert layout["attn_tp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # MoE EP strided over the MoE TP width 2; MoE TP contiguous pairs.
    assert layout["moe_ep"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert layout["moe_tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    for groups in layout.values():  # every kind partitions the world
        assert sorted(r for g in groups for r in g) == list(range(8))
    with pytest.raises(tpcomm.InvalidArgumentError, match="tp_size 6 is not divisible by "
                                                          "moe_ep_size 4"):
        tpcomm.parallel_layout(6, moe_ep_size=4)


def test_parallel_groups_check_their_flags_and_say_when_there_is_no_gpu():
    with tpcomm.Bootstrap(rank=0, world_size=1) as b:
        with pytest.raises(tpcomm.InvalidArgumentError, match="world_size 1 != tp_size 8"):
            tpcomm.ParallelGroups(b, 0, tp_size=8)
        with pytest.raises(tpcomm.InvalidArgumentError, match="device -1 is negative"):
            tpcomm.ParallelGroups(b, -1)
        if not tpcomm.info(as_json=True)["gpus"]:
            with pytest.raises(tpcomm.UnavailableError,
                               match="no (usable NVIDIA driver|CUDA GPU)"):
                tpcomm.ParallelGroups(b, 0)


INTERRUPTED_SCRIPT = textwrap.dedent("""
    import sys, time
    import tpcomm
    what, port = sys.argv[1], int(sys.argv[2])
    start = None
    try:
        if what == "create":  # rank 1 of 2 waits for a rank 0 that never comes
            print("ready", flush=True)
            start = time.monotonic()
            tpcomm.Bootstrap(rank=1, world_size=2, store_port=port)
        elif what == "get":
            b = tpcomm.Bootstrap(rank=0, world_size=1, store_port=port)
            print("ready", flush=True)
            start = time.monotonic()
            b.store_get("never set", timeout_ms=60000)
        elif what == "barrier":  # rank 0 of 2; rank 1 joins and never calls the barrier
            b = tpcomm.Bootstrap(rank=0, world_size=2, store_port=port)
            print("ready", flush=True)
            start = time.monotonic()
            b.barrier()
        else:  # the idle rank 1
            b = tpcomm.Bootstrap(rank=1, world_size=2, store_port=port)
            time.sleep(30)
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - start:.3f}", flush=True)
""")


@pytest.mark.parametrize("what", ["get", "barrier", "create"])
def test_ctrl_c_interrupts_a_blocking_call(what):
    """Ctrl-C during a blocking store_get, a barrier, or a bootstrap waiting for its peers raises
    KeyboardInterrupt at once, not at the store's deadline (60 s here)."""
    env = dict(os.environ, TPCOMM_TIMEOUT_MS="60000")
    port = str(free_port())
    run = [sys.executable, "-c", INTERRUPTED_SCRIPT]
    p = subprocess.Popen(run + [what, port], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env)
    idle = (subprocess.Popen(run + ["idle", port], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=env) if what == "barrier" else None)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # well inside the blocking call
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=20)
    finally:
        p.kill()
        if idle is not None:
            idle.kill()
            idle.wait()
    waited = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("interrupted")]
    assert waited, out
    assert waited[0] < 2.0, out


class DictStore:
    """A stand-in for a `torch.distributed.Store` shared by threads: the methods tpcomm uses."""

    def __init__(self):
        self.data = {}
        self.lock = threading.Lock()

    def set(self, key, value):
        with self.lock:
            self.data[key] = bytes(value)

    def get(self, key):
        with self.lock:
            return self.data[key]

    def add(self, key, amount):
        with self.lock:
            n = int.from_bytes(self.data.get(key, bytes(8)), "little", signed=True) + amount
            self.data[key] = n.to_bytes(8, "little", signed=True)
            return n

    def check(self, keys):
        with self.lock:
            return all(k in self.data for k in keys)

    def delete_key(self, key):
        with self.lock:
            return self.data.pop(key, None) is not None


def test_bootstrap_over_the_applications_store():
    """Three ranks (threads) over one application store: no store or port of tpcomm's own;
    locality from host names (a collective), barriers, the store, a sub-group."""
    store, world = DictStore(), 3
    results, errors = {}, []

    def rank_main(rank):
        try:
            with tpcomm.Bootstrap.from_store(store, rank, world, timeout_ms=20000) as b:
                assert (b.rank, b.world_size, b.local_world_size) == (rank, world, world)
                b.store_set(f"from/{rank}", f"rank {rank}")
                b.barrier()
                got = [b.store_get(f"from/{r}").decode() for r in range(world)]
                with b.split([r for r in range(world) if r != 1] if rank != 1 else [1],
                             "sub") as sub:
                    sub.barrier()
                    results[rank] = (got, sub.world_size)
                b.barrier()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(f"rank {rank}: {e!r}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for r in range(world):
        assert results[r] == ([f"rank {q}" for q in range(world)], 1 if r == 1 else 2)
    # Its keys live under tpcomm/ in the application's store.
    assert all(k.startswith("tpcomm/") for k in store.data), sorted(store.data)[:5]


def test_bootstrap_over_the_applications_store_times_out_naming_the_missing_rank():
    with pytest.raises(tpcomm.TimeoutError, match="rank 1 did not arrive"):
        tpcomm.Bootstrap.from_store(DictStore(), 0, 2, timeout_ms=300)
    with pytest.raises(TypeError, match=r"the store has no set\(\)"):
        tpcomm.Bootstrap.from_store(object(), 0, 1)

    class Broken(DictStore):
        def set(self, key, value):
            raise RuntimeError("the engine's store is down")

    with pytest.raises(tpcomm.TpcommError, match="the application's store failed"):
        tpcomm.Bootstrap.from_store(Broken(), 0, 2, timeout_ms=300)


def test_store_values_are_bytes_like():
    with tpcomm.Bootstrap(rank=0, world_size=1) as b:
        # bytes(5) would store five zero bytes, bytes(10**10) first build ten gigabytes.
        for value in (5, True, 10**10, 1.5, None, [1, 2]):
            with pytest.raises(TypeError, match="store values are bytes-like or str, not "):
                b.store_set("k", value)
        assert not b.store_check("k")
        b.store_set("k", bytearray(b"ab"))
        assert b.store_get("k") == b"ab"
        b.store_set("k", memoryview(b"cd"))
        assert b.store_get("k") == b"cd"


def test_tensor_addresses_are_checked():
    # ctypes would wrap 2**64 + 5 to 5.
    with pytest.raises(ValueError, match="data_ptr 18446744073709551621 is not an address"):
        tpcomm.tensor(2**64 + 5, "float32", [4])
    with pytest.raises(ValueError, match="data_ptr -1 is not an address"):
        tpcomm.tensor(-1, "float32", [4])
    with pytest.raises(TypeError, match="data_ptr must be an int"):
        tpcomm.tensor(1.0, "float32", [4])
    assert tpcomm.tensor(2**64 - 1, "float32", [4]).data == 2**64 - 1


def _from_store_on_two_ranks(store, timeout_ms):
    """Bootstrap.from_store on ranks 0 and 1 (threads): (rank -> node_id, rank -> exception,
    seconds taken). Threads that are still running after 20 s are reported as such."""
    nodes, errors = {}, {}

    def rank_main(rank):
        try:
            with tpcomm.Bootstrap.from_store(store, rank, 2, timeout_ms=timeout_ms) as b:
                nodes[rank] = b.node_id
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            errors[rank] = e

    start = time.monotonic()
    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads), "a rank is still running after 20 s"
    return nodes, errors, time.monotonic() - start


def test_the_applications_store_returning_wrong_types_is_refused_naming_the_method():
    # The rank whose call got the bad value names it; the other fails at its deadline.
    class IntGet(DictStore):
        def get(self, key):
            super().get(key)
            return 3  # bytes(3) would be three zero bytes: every rank its own host

    nodes, errors, _ = _from_store_on_two_ranks(IntGet(), 1000)
    assert not nodes and len(errors) == 2, (nodes, errors)
    assert any("the store's get(" in str(e) and "returned int, not bytes" in str(e)
               for e in errors.values()), errors

    class HugeAdd(DictStore):
        def add(self, key, amount):
            super().add(key, amount)
            return 2**70  # cut to 64 bits by ctypes

    nodes, errors, _ = _from_store_on_two_ranks(HugeAdd(), 1000)
    assert not nodes and len(errors) == 2, (nodes, errors)
    assert any("the store's add(" in str(e) and "outside 64 bits" in str(e)
               for e in errors.values()), errors

    class Raising(DictStore):
        def get(self, key):
            raise RuntimeError("the engine's store is down")

    nodes, errors, _ = _from_store_on_two_ranks(Raising(), 1000)
    assert not nodes and len(errors) == 2, (nodes, errors)
    assert any("the application's store failed" in str(e) and
               "RuntimeError: the engine's store is down" in str(e)
               for e in errors.values()), errors


@pytest.mark.parametrize("method", ["get", "add"])
def test_a_blocking_store_call_is_bounded_by_the_timeout(method):
    release = threading.Event()

    class Blocking(DictStore):
        pass

    def blocked(*args):
        release.wait()  # a store that stopped answering

    setattr(Blocking, method, blocked)
    try:
        nodes, errors, took = _from_store_on_two_ranks(Blocking(), 1000)
    finally:
        release.set()
    assert not nodes and len(errors) == 2, (nodes, errors)
    assert all(isinstance(e, tpcomm.TimeoutError) for e in errors.values()), errors
    assert any(f"the store's {method}(" in str(e) and "did not return within" in str(e)
               for e in errors.values()), errors
    assert took < 8, took
