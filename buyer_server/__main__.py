"""python -m buyer_server: serve the buyer ops until SIGTERM or Ctrl-C."""
from __future__ import annotations

import signal
import sys

# Ctrl-C ends the process quietly, as SIGTERM does, until the runner's handlers are in place.
signal.signal(signal.SIGINT, signal.SIG_DFL)

from runtime.runner import main as run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Entry point of `market-buyer-server` (the runner imports .ops once signals are handled)."""
    return run("buyer", argv=argv)


if __name__ == "__main__":
    sys.exit(main())
