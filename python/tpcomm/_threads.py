# SPDX-License-Identifier: Apache-2.0
"""A call run on a thread of its own, so that its caller can stop waiting for it: Ctrl-C during a
blocking C call (`_interruptible`), a store's call past its timeout (`_store._bounded`)."""
import threading


class _OnThread:
    """`fn()` started on a daemon thread named `name`. Its caller waits with `wait`, and may
    abandon it: the call then ends by itself, or with the process."""

    def __init__(self, fn, name):
        self._done = threading.Event()
        self._outcome = []
        threading.Thread(target=self._run, args=(fn,), name=name, daemon=True).start()

    def _run(self, fn):
        try:
            self._outcome.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller by result()
            self._outcome.append((False, e))
        finally:
            self._done.set()

    def wait(self, seconds):
        """True when the call has returned (or raised), waiting at most `seconds` for it."""
        return self._done.wait(seconds)

    def done(self):
        return self._done.is_set()

    def result(self):
        """What the call returned, or its exception raised here; after `wait` returned True."""
        ok, value = self._outcome[0]
        if not ok:
            raise value
        return value
