"""``python -m acker_service``: the same as the ``acker-server`` command."""

from .cli import main

raise SystemExit(main())
