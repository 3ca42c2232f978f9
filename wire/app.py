"""Dispatch of one request: op lookup, token check, argument check, handler.

Checks run in the order PROTOCOL.md fixes: UNKNOWN_OP, UNAUTHENTICATED, BAD_REQUEST, then
the op's own errors. A private op runs inside the transaction that checked its token.
"""
from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from .envelope import ok_response, request_args, request_id
from .errors import BadRequestError, InternalError, ProtocolError, UnauthenticatedError, UnknownOpError
from .ops import OpSpec

Handler = Callable[..., dict[str, Any]]
log = logging.getLogger("market.app")
UNKNOWN_OP = "unknown"  # the op label of a request naming none this server serves
SERVER_FAULTS = frozenset({"INTERNAL", "UNAVAILABLE"})  # answers whose message names the request id


def op_label(message: dict[str, Any], ops: Collection[str]) -> str:
    """The request's op for logs and metrics: UNKNOWN_OP unless it is one of `ops`, so a
    client's text is no label (nor is a list there, which no set lookup takes)."""
    op = message.get("op")
    return op if isinstance(op, str) and op in ops else UNKNOWN_OP


class RequestScope:
    """Entered around each request's dispatch; gives the request's id (observe.tracing's also
    sets the log context and makes a span)."""

    def request(self, op: str, peer: str | None) -> AbstractContextManager[str]:
        return nullcontext(os.urandom(8).hex())


class Gate(Protocol):
    """Runs work(tx, session) for a token's live session, or raises UNAUTHENTICATED."""

    def run(self, token: str, write: bool, work: Callable[[Any, Any], Any]) -> Any: ...


class Background(Protocol):
    """Work a server process runs beside its ops (the buyer server's settler)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Stepwise:
    """A private op that runs its own transactions: `run(first_step)`, where
    first_step(work) runs work(tx, session, args) in the gate's transaction, so the token
    and the arguments are checked in the protocol's order before anything else. Its steps
    may wait on another system (the purchase's on the payment processor)."""

    run: Callable[[Callable[[Callable[[Any, Any, dict[str, Any]], Any]], Any]], dict[str, Any]]


class App:
    """A server's ops: specs from wire.ops paired with handlers, called as handler(**args),
    handler(peer, **args) if named in `addressed`, or, if private, handler(tx, session, **args)."""

    scope: RequestScope = RequestScope()

    def __init__(self, specs: dict[str, OpSpec], handlers: dict[str, Handler | Stepwise], gate: Gate,
                 addressed: frozenset[str] = frozenset(), background: Sequence[Background] = ()) -> None:
        missing = set(specs) ^ set(handlers)
        if missing:
            raise ValueError(f"ops without a spec or a handler: {sorted(missing)}")
        self.specs, self.handlers, self.gate, self.addressed = specs, handlers, gate, addressed
        self.background = list(background)

    def handle(self, message: dict[str, Any], peer: str | None = None) -> dict[str, Any]:
        """The response to one request message from `peer` (errors are raised, not returned;
        those that are the server's fault name the request's id, which its log lines carry)."""
        with self.scope.request(op_label(message, self.specs), peer) as rid:
            try:
                return self._dispatch(message, peer)
            except ProtocolError as exc:
                if exc.code not in SERVER_FAULTS:
                    raise
                named = copy.copy(exc)
                named.message = f"{exc.message} (request {rid})"
                raise named from exc
            except Exception:
                log.exception("internal error serving op %r", message.get("op"))
                fault = f"internal error; details are in the server log (request {rid})"
                raise InternalError(fault) from None

    def _dispatch(self, message: dict[str, Any], peer: str | None) -> dict[str, Any]:
        op = message.get("op")
        if not isinstance(op, str):
            raise BadRequestError("op: required, must be a string")
        spec = self.specs.get(op)
        if spec is None:
            raise UnknownOpError(f"no op {op!r} on this server")
        handler = self.handlers[op]
        if spec.public:
            assert not isinstance(handler, Stepwise)
            args = spec.validate(request_args(message))
            result = handler(peer, **args) if op in self.addressed else handler(**args)
            return ok_response(request_id(message), result)
        token = message.get("token")
        if not token or not isinstance(token, str):
            raise UnauthenticatedError(f"{op} needs a token; log in first")

        def first_step(step: Callable[[Any, Any, dict[str, Any]], Any]) -> Any:
            return self.gate.run(token, spec.writes, lambda tx, session: step(
                tx, session, spec.validate(request_args(message))))

        if isinstance(handler, Stepwise):
            result = handler.run(first_step)
        else:
            result = first_step(lambda tx, session, args: handler(tx, session, **args))
        return ok_response(request_id(message), result)
