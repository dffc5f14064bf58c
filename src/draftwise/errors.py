"""One exception type for every user-facing mistake.

The CLI turns a :class:`DraftwiseError` into one line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""


class DraftwiseError(Exception):
    """Bad input or configuration: the message says what was wrong and what is valid."""
