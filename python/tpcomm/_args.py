# SPDX-License-Identifier: Apache-2.0
"""Python values checked and made into the C API's arguments: ctypes would wrap an int that does
not fit, and a NUL would cut a string short, without a word."""
import ctypes


def _ref(t):
    return None if t is None else ctypes.byref(t)


def _key(key):
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, not {type(key).__name__}")
    return _text("key", key)


def _value(value):
    """A store value as bytes: a bytes-like object or a str (UTF-8). Anything else is a TypeError:
    bytes(5) would make five zero bytes (and bytes(10**10) ten gigabytes) of an int."""
    if isinstance(value, str):
        return value.encode()
    try:
        return memoryview(value).tobytes()
    except TypeError:
        raise TypeError(f"store values are bytes-like or str, not {type(value).__name__}") from None


def _text(name, s):
    """`s` (a str) as the C string it becomes; a NUL would cut it short there."""
    if not isinstance(s, str):
        raise TypeError(f"{name} must be a str, not {type(s).__name__}")
    if "\0" in s:
        raise ValueError(f"{name} {s!r} holds a NUL character")
    return s.encode()


def _int(name, v, bits=32):
    """`v` as a C integer of `bits` bits, checked: ctypes would wrap `2**32 + 1` to 1."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not lo <= v <= hi:
        raise ValueError(f"{name} {v} is outside {lo}..{hi}")
    return v


def _pointer(name, v):
    """`v` as a C pointer: an int in 0..2**64 - 1 (ctypes would wrap 2**64 + 5 to 5)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int (an address), not {type(v).__name__}")
    if not 0 <= v < (1 << 64):
        raise ValueError(f"{name} {v} is not an address (0..2**64 - 1)")
    return v


def _stream(v):
    """A `cudaStream_t` given as an int (0: the legacy default stream)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"stream must be an int (a cudaStream_t), not {type(v).__name__}")
    if not 0 <= v < (1 << 64):
        raise ValueError(f"stream {v} is not a pointer")
    return v
