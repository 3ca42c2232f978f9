"""Error objects on the wire: an answer's `retryable` travels as sent, the code's by default."""
from __future__ import annotations

import pytest

from wire.errors import BusyError, ConflictError, UnavailableError, error_from_wire


@pytest.mark.parametrize("error", [UnavailableError("away"), BusyError("full"), ConflictError("taken"),
                                   UnavailableError("made, not read", retryable=False)])
def test_an_error_comes_back_from_the_wire_as_it_was_sent(error: Exception) -> None:
    assert isinstance(error, UnavailableError | BusyError | ConflictError)
    back = error_from_wire(error.to_wire())
    assert (type(back), back.message, back.retryable) == (type(error), error.message, error.retryable)


def test_retryable_is_the_codes_unless_an_answer_says_otherwise() -> None:
    assert UnavailableError("away").to_wire()["retryable"] is True  # the contract's table
    assert UnavailableError("made", retryable=False).to_wire()["retryable"] is False
    assert UnavailableError.retryable is True  # the class keeps the table's value
    odd = error_from_wire({"code": "UNAVAILABLE", "message": "m", "retryable": "no"})
    assert odd.retryable is True  # not a boolean: the code's
