"""``python -m acker_demo``: the same as the ``acker-demo`` command."""

from .cli import main

raise SystemExit(main())
