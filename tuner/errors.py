"""User-facing errors.

A ``TunerError`` is a problem with the user's input (a file, a YAML key, the data). The CLI
prints its message on one line and exits with code 2, without a traceback.
"""


class TunerError(Exception):
    """Bad input: the message names the problem and the fix."""


class DiskFull(TunerError):
    """A write failed because the file system (or the user's quota on it) is full: the message
    names the file, the file system and its free space, and the fix."""
