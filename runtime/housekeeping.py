"""The housekeeping thread of each server process, one more of its background tasks."""
from __future__ import annotations

import logging
import random
import threading
from typing import Any

from db.accounts import SessionPolicy
from db.database import Database
from db.housekeeping import sweep

log = logging.getLogger("market.housekeeping")


class Housekeeper:
    """A thread sweeping every `interval_s` (give or take a tenth, so processes spread out)."""

    def __init__(self, db: Database, policy: SessionPolicy, interval_s: float) -> None:
        self._db, self._policy, self._interval_s = db, policy, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="market-housekeeping", daemon=True)

    @classmethod
    def for_settings(cls, db: Database, settings: Any) -> Housekeeper:
        """The housekeeper a server's settings (runtime.config.Settings) ask for."""
        return cls(db, SessionPolicy.from_settings(settings), settings.housekeeping_interval_s)

    def start(self) -> None:
        """Start sweeping."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the batch in hand."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()

    def _keep(self) -> None:
        while not self._stop.wait(self._interval_s * random.uniform(0.9, 1.1)):
            try:
                deleted = sweep(self._db, self._policy, stop=self._stop.is_set)
            except Exception:  # a database away for a while: the next sweep tries again
                log.exception("housekeeping failed; trying again in %.0f s", self._interval_s)
                continue
            if deleted:
                log.info("housekeeping deleted %d expired sessions, old failed-login counts and "
                         "commit tokens", deleted)
