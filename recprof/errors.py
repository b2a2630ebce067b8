"""The one error type the CLI turns into a clean one-line message and a non-zero exit.

Anything a user can cause (a bad file, a bad flag, a config that does not validate) raises
`RecprofError` with a message that names the file and the problem. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

from enum import IntEnum


class RecprofError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""


class ExitCode(IntEnum):
    """Every exit status a recprof command gives, as the README's table states them: the one
    place a command reads its code from (capture passes the job's own status on besides)."""

    OK = 0
    #: `compare --fail-if-slower`: the last run is slower beyond the threshold, with
    #: confidence; `trigger`: no window was recorded.
    NOT_MET = 1
    #: A usage error or bad input: one line on standard error naming the file and the problem.
    USAGE = 2
    #: `capture`: the job exited 0 but no rank wrote a trace.
    NO_TRACE = 3
    #: Interrupted (Ctrl-C): what was finished is kept, and one line says what.
    INTERRUPTED = 130
