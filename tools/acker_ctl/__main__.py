"""``python -m acker_ctl``: the same as the ``acker-ctl`` command."""

from .cli import main

raise SystemExit(main())
