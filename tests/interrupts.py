"""Ctrl-C for the tests that press it on a child process."""

from __future__ import annotations

import signal


def sigint_default() -> None:
    """`preexec_fn` for a child the test will interrupt: give it the default SIGINT.

    A suite started in the background by a non-interactive shell (`cmd &`, `nohup`) inherits
    SIGINT ignored, and a Python child started with SIGINT ignored never raises
    KeyboardInterrupt, so the test's Ctrl-C would be lost and the test would wait out its
    timeout instead of testing the interruption."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
