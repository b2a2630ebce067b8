"""The one error type the CLI turns into a clean one-line message and a non-zero exit.

Anything a user can cause (a bad file, a bad flag, a config that does not validate) raises
`RecprofError` with a message that names the file and the problem. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations


class RecprofError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""
