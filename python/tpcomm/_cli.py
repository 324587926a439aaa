# SPDX-License-Identifier: Apache-2.0
"""The `tpcomm` command of the wheel: runs the `tpcomm` program installed in the package."""
import os
import sys


def program():
    """The path of the package's `tpcomm` program (None when the wheel was built without it)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tpcomm")
    return path if os.access(path, os.X_OK) else None


def main():
    path = program()
    if path is None:
        sys.stderr.write("tpcomm: this installation has no tpcomm program: it was built where "
                         "CLI11's headers were missing (Debian: apt-get install libcli11-dev, "
                         "then pip install again)\n")
        return 1
    os.execv(path, [path, *sys.argv[1:]])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
