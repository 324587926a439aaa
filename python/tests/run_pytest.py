# SPDX-License-Identifier: Apache-2.0
"""Runs pytest on the files given (CTest's entry point): exits 77, which CTest reports as
skipped, where pytest is not installed or nothing ran."""
import sys

try:
    import pytest
except ImportError:
    print("pytest is not installed: skipped (scripts/install-deps.sh installs python3-pytest)")
    sys.exit(77)

status = pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]])
# 5: nothing ran (a file whose dependency, such as PyTorch, is missing skips itself whole).
sys.exit(77 if status == pytest.ExitCode.NO_TESTS_COLLECTED else int(status))
