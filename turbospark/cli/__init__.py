"""The command line: ``turbospark`` and ``python -m turbospark``, a thin layer over the analysis and recording wings."""

from ._main import main

__all__ = ["main"]
