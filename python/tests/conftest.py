# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the Python tests."""
import socket


def free_port():
    """A free TCP port on loopback (released: the store binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
