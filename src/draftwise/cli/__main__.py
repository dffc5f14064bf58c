"""``python -m draftwise.cli``: the same as the ``draftwise`` command."""

from draftwise.cli import main

raise SystemExit(main())
