"""``python -m turbospark.transformers --list``: the model families ``capture`` supports, as computed."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from turbospark.transformers._families import families, format_families


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the supported architectures (``--list``); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m turbospark.transformers", description=__doc__)
    parser.add_argument("--list", action="store_true", help="list the model families of the installed transformers")
    args = parser.parse_args(argv)
    if not args.list:
        parser.print_help(sys.stderr)
        return 2
    sys.stdout.write(format_families(families()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
