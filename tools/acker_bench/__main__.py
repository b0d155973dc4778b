"""``python -m acker_bench``: the same as the ``acker-bench`` command."""

from .cli import main

raise SystemExit(main())
