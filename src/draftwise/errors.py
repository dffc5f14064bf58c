"""One exception type for every user-facing mistake.

The CLI turns a :class:`DraftwiseError` into one line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json


class DraftwiseError(Exception):
    """Bad input or configuration: the message says what was wrong and what is valid."""


def json_error_text(error: json.JSONDecodeError, *, line: bool = True) -> str:
    """What broke in a JSON text and where, as one phrase: ``Unterminated string starting at line 1, column 2``
    (json ends some messages with "at", for the place to follow). ``line=False``: the column only, for a
    text that is one line of a file the caller numbers itself."""
    place = f"line {error.lineno}, column {error.colno}" if line else f"column {error.colno}"
    return f"{error.msg.removesuffix(' at')} at {place}"
