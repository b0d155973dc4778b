"""``python -m acker_demo``: the same as the ``acker-demo`` command."""

from . import main

raise SystemExit(main())
