"""python -m seller_server: serve the seller ops until SIGTERM or Ctrl-C."""
from __future__ import annotations

import sys

from wire.runner import main as run

from .ops import build_app


def main(argv: list[str] | None = None) -> int:
    """Entry point of `market-seller-server`."""
    return run("seller", build_app, argv)


if __name__ == "__main__":
    sys.exit(main())
