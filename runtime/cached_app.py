"""A server's App with the catalogue read cache (db.cache) in front of its handlers.

With MARKET_CACHE on, the catalogue reads are answered from the cache while their counters
are unchanged, and a catalogue write bumps the counters of what it changed after its commit
and before its answer (logout bumps its session's), so no read sent after it sees older data.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from db.cache import CATALOGUE_WRITES, ReadCache, from_settings
from wire.app import App, Gate
from wire.ops import OpSpec


class InvalidatingApp(App):
    """An App whose catalogue writes bump the counters after their commit, before their answer."""

    def __init__(self, specs: dict[str, OpSpec], handlers: dict[str, Any], gate: Gate,
                 cache: ReadCache, addressed: frozenset[str] = frozenset(),
                 background: Sequence[Any] = ()) -> None:
        super().__init__(specs, cache.with_cached_reads(handlers), gate, addressed, background)
        self.cache = cache

    def handle(self, message: dict[str, Any], peer: str | None = None) -> dict[str, Any]:
        """The response, the cache told of any catalogue write first."""
        op = message.get("op")
        if op == "logout":
            try:
                return super().handle(message, peer)
            finally:
                self.cache.after_logout(message.get("token"))
        if op not in CATALOGUE_WRITES:
            return super().handle(message, peer)
        args = message.get("args") or {}
        try:
            response = super().handle(message, peer)
        except BaseException as exc:
            self.cache.after_write(str(op), args, exc)
            raise
        self.cache.after_write(str(op), args, response)
        return response


def server_app(settings: Any, specs: dict[str, OpSpec], handlers: dict[str, Any], gate: Gate,
               addressed: frozenset[str] = frozenset(), background: Sequence[Any] = ()) -> App:
    """A server's App; with MARKET_CACHE on, its catalogue reads cached and its writes keeping
    them fresh."""
    read_cache = from_settings(settings)
    if read_cache is None:
        return App(specs, handlers, gate, addressed, background)
    return InvalidatingApp(specs, handlers, gate, read_cache, addressed, background)
