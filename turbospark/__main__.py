"""``python -m turbospark``: the same command line as the ``turbospark`` script."""

from .cli import main

raise SystemExit(main())
