"""``python -m acker_cluster``: the same as the ``acker-cluster`` command."""

from .cli import main

raise SystemExit(main())
