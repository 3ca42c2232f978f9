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


class Housekeeper(threading.Thread):
    """A thread sweeping every `interval_s` (give or take a tenth, so processes spread out)."""

    def __init__(self, db: Database, policy: SessionPolicy, interval_s: float) -> None:
        super().__init__(name="market-housekeeping", daemon=True)
        self._db, self._policy, self._interval_s = db, policy, interval_s
        self._stopping = threading.Event()

    @classmethod
    def for_settings(cls, db: Database, settings: Any) -> Housekeeper:
        """The housekeeper a server's settings (runtime.config.Settings) ask for."""
        return cls(db, SessionPolicy.from_settings(settings), settings.housekeeping_interval_s)

    def stop(self) -> None:
        """Stop after the batch in hand."""
        self._stopping.set()
        if self.is_alive():
            self.join()

    def run(self) -> None:
        while not self._stopping.wait(self._interval_s * random.uniform(0.9, 1.1)):
            try:
                deleted = sweep(self._db, self._policy, stop=self._stopping.is_set)
            except Exception:  # a database away for a while: the next sweep tries again
                log.exception("housekeeping failed; trying again in %.0f s", self._interval_s)
                continue
            if deleted:
                log.info("housekeeping deleted %d expired sessions, old failed-login counts and "
                         "commit tokens", deleted)
