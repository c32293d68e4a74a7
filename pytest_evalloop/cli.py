"""The `evalloop` console script."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the `evalloop` command line."""
    return 0


if __name__ == "__main__":
    sys.exit(main())
