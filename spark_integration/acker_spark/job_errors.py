"""What a failed Spark job's exception says: the Python exception's type, message and where it was raised.

A job whose task raised in a Python worker reaches the driver as a Java-side
error (``Py4JJavaError`` for RDD jobs, ``PythonException`` for DataFrame
jobs) whose text carries the worker's Python traceback. :func:`job_error`
reads the last traceback in it (the innermost exception) into a
:class:`JobError`, the cause a dead letter and the driver's error report name.
An exception raised on the driver itself is described from its own traceback.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass

__all__ = ["JobError", "job_error", "CONFIGURATION_ERRORS", "POISON_ERRORS", "error_type"]

# Raised by executors whose acker configuration is wrong (client's address list,
# credentials, refused batches) or whose job cannot give exactly-once output (rows
# anchored to no record): cured by fixing the job or its configuration, never by a replay.
CONFIGURATION_ERRORS = frozenset({"ClusterMisconfigured", "RequestRefused", "UnanchoredOutput"})

# Exceptions that say the record itself is bad (malformed, missing a field, of the wrong type):
# a replay raises them again, so such a record is dead-lettered at once, and a bolt isolates
# it even when every record of a batch raises one. Others (timeouts, connections) are retried.
POISON_ERRORS = frozenset(
    {
        "ValueError",
        "KeyError",
        "TypeError",
        "IndexError",
        "AttributeError",
        "UnicodeDecodeError",
        "UnicodeEncodeError",
        "JSONDecodeError",
        "ArrowInvalid",
        "ArrowTypeError",
        "DecodeError",
    }
)

_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
_MAX_MESSAGE = 500  # a dead-letter row holds the cause, not a whole log


@dataclass(frozen=True)
class JobError:
    """One exception: its type (class name, module dropped), message and where it was raised (``file:line in fn``)."""

    type: str
    message: str
    where: str = ""

    def __str__(self) -> str:
        at = f" (at {self.where})" if self.where else ""
        return f"{self.type}: {self.message}{at}"

    @property
    def configuration(self) -> bool:
        """True when the error says the acker configuration is wrong (a replay cannot cure it)."""
        return self.type in CONFIGURATION_ERRORS


def job_error(err: BaseException) -> JobError:
    """The innermost Python exception ``err`` reports: from a worker's traceback in its text, else ``err`` itself."""
    parsed = _from_text(str(err))
    if parsed is not None:
        return parsed
    frames = traceback.extract_tb(err.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    return JobError(type(err).__name__, _clip(str(err)), where)


def error_type(cause: str | None) -> str | None:
    """The exception type a cause names (``"ValueError: ..."`` -> ``ValueError``), or None for free text."""
    if not cause:
        return None
    match = _EXCEPTION.match(cause.split("\n", 1)[0])
    return match["type"].rsplit(".", 1)[-1] if match and match["message"] is not None else None


def _from_text(text: str) -> JobError | None:
    """The last Python traceback in ``text`` as a JobError, or None when it holds none."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None
    where = ""
    for line in text[start + len(_TRACEBACK) :].splitlines():
        frame = _FRAME.match(line)
        if frame:
            where = f"{frame['file']}:{frame['line']} in {frame['func']}"
            continue
        if not line.strip() or line[0].isspace():
            continue  # the source line under a frame, or a blank
        exc = _EXCEPTION.match(line.strip())
        if exc:
            return JobError(exc["type"].rsplit(".", 1)[-1], _clip(exc["message"] or ""), where)
    return None


def _clip(message: str) -> str:
    message = message.strip()
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 3] + "..."
