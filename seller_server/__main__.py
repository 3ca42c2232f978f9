"""python -m seller_server: serve the seller ops until SIGTERM or Ctrl-C."""
from __future__ import annotations

import signal
import sys

# Until the runner's handlers are in place, Ctrl-C ends the process as SIGTERM does: quietly,
# not with a traceback of whatever Python was importing.
signal.signal(signal.SIGINT, signal.SIG_DFL)

from runtime.runner import main as run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Entry point of `market-seller-server` (the runner imports .ops once signals are handled)."""
    return run("seller", argv=argv)


if __name__ == "__main__":
    sys.exit(main())
