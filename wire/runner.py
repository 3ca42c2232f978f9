"""What `python -m buyer_server` and `python -m seller_server` share: settings,
logging, the database, the App and the server loop, from one call.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from .app import App
from .config import Settings, server_settings
from .server import ServerLimits, run_server


def limits_of(settings: Settings) -> ServerLimits:
    """The server loop's limits from settings."""
    return ServerLimits(max_connections=settings.max_connections, max_frame=settings.max_frame,
                        idle_timeout_s=settings.idle_timeout_s,
                        frame_deadline_s=settings.frame_deadline_s, threads=settings.threads)


def main(role: str, build_app: Callable[[Settings, Any], App], argv: list[str] | None = None) -> int:
    """Parse settings, open the database, build the app and serve until stopped."""
    from db import Database  # the one place the protocol package meets the data layer

    settings = server_settings(role, argv)
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s")
    database = Database(settings.db_url, pool_size=settings.threads)
    database.create_schema()
    app = build_app(settings, database)
    run_server(app, settings.host, settings.port, limits_of(settings), on_stop=database.close)
    return 0
