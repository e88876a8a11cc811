"""Errors users see: every bad input names its file, line (or record) and reason."""

import errno
import os


class CsmdError(Exception):
    """An error reported to the user as one line, without a traceback."""


class InputError(CsmdError):
    """Malformed input: `source` is a file name or record id, `line` is 1-based or None."""

    def __init__(self, source, line, reason):
        self.source, self.line, self.reason = str(source), line, reason
        where = self.source if line is None else f"{self.source}:{line}"
        super().__init__(f"{where}: {reason}")


def missing(path) -> InputError:
    """The one wording of a file that is not there: the operating system's."""
    return InputError(path, None, os.strerror(errno.ENOENT))


class NotYetApplied(CsmdError):
    """A control request was logged but has not taken effect within the wait (the daemon is busy)."""
