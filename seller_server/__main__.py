"""python -m seller_server: serve the seller ops until SIGTERM or Ctrl-C."""
from __future__ import annotations

import signal
import sys

# Ctrl-C ends the process quietly, as SIGTERM does, until the runner's handlers are in place.
signal.signal(signal.SIGINT, signal.SIG_DFL)

from runtime.runner import main as run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Entry point of `market-seller-server` (the runner imports .ops once signals are handled)."""
    return run("seller", argv=argv)


if __name__ == "__main__":
    sys.exit(main())
