"""The simulated processor's rules (buyer_server.payments) over its ledger's contract, kept by
a fake in memory: each call idempotent per key, a capture once, a void final."""
from __future__ import annotations

import pytest
from fakes import FakeLedger

from buyer_server.payments import Card, PaymentRefusedError, SimulatedProcessor
from db.ledger import AUTHORISED, CAPTURED, DECLINED, VOIDED, Ledger
from wire.errors import PaymentDeclinedError

CARD = Card("Ann Lee", "4111111111111111", "12/40")


def processor(decline_rate: float = 0.0, ledger: FakeLedger | None = None) -> SimulatedProcessor:
    return SimulatedProcessor(ledger or FakeLedger(), decline_rate)  # type: ignore[arg-type]


def state(p: SimulatedProcessor, key: str) -> tuple[str, int] | None:
    entry = p.ledger.lookup(key)
    return None if entry is None else (entry.state, entry.captures)


def test_the_fake_offers_what_the_processor_calls_of_a_ledger() -> None:
    public = {name for name in vars(Ledger) if not name.startswith("_")} - {"create_table"}
    assert public <= set(vars(FakeLedger))


def test_an_authorisation_captured_twice_is_captured_once() -> None:
    p = processor()
    p.authorise("k", 7, 1250, CARD)
    entry = p.ledger.lookup("k")
    assert entry is not None and (entry.buyer_id, entry.amount_cents, entry.state) == (7, 1250, AUTHORISED)
    p.capture("k")
    p.capture("k")  # asked again (its answer lost): no error, no second capture
    assert state(p, "k") == (CAPTURED, 1)


def test_a_void_after_the_capture_is_refused_and_changes_nothing() -> None:
    p = processor()
    p.authorise("k", 7, 100, CARD)
    p.capture("k")
    with pytest.raises(PaymentRefusedError, match="captured already"):
        p.void("k")
    assert state(p, "k") == (CAPTURED, 1)


def test_a_voided_authorisation_is_never_captured_and_a_second_void_is_harmless() -> None:
    p = processor()
    p.authorise("k", 7, 100, CARD)
    p.void("k")
    p.void("k")
    with pytest.raises(PaymentRefusedError, match=r"cannot capture \(voided\)"):
        p.capture("k")
    with pytest.raises(PaymentDeclinedError, match="ending 1111 was declined"):
        p.authorise("k", 7, 100, CARD)  # a late authorisation under a voided key
    assert state(p, "k") == (VOIDED, 0)


def test_a_key_voided_before_it_was_ever_authorised_can_no_longer_be() -> None:
    p = processor()
    p.void("never-seen")  # the settler voids a purchase cut off before its authorisation
    with pytest.raises(PaymentDeclinedError):
        p.authorise("never-seen", 7, 100, CARD)
    with pytest.raises(PaymentRefusedError):
        p.capture("never-seen")
    assert state(p, "never-seen") == (VOIDED, 0)


def test_a_capture_of_an_unknown_key_is_refused_and_records_nothing() -> None:
    p = processor()
    with pytest.raises(PaymentRefusedError, match="unknown key"):
        p.capture("nobody")
    assert p.ledger.lookup("nobody") is None


def test_an_authorisation_asked_again_gets_its_first_answer_whatever_the_rate_now() -> None:
    ledger = FakeLedger()
    with pytest.raises(PaymentDeclinedError):
        processor(1.0, ledger).authorise("declined", 7, 100, CARD)
    with pytest.raises(PaymentDeclinedError):
        processor(0.0, ledger).authorise("declined", 7, 100, CARD)
    processor(0.0, ledger).authorise("approved", 7, 100, CARD)
    processor(1.0, ledger).authorise("approved", 7, 999, CARD)  # not declined, not re-recorded
    assert [(e.payment_key, e.state, e.amount_cents) for e in ledger.entries()] == [
        ("approved", AUTHORISED, 100), ("declined", DECLINED, 100)]
    with pytest.raises(PaymentRefusedError, match=r"\(declined\)"):
        processor(0.0, ledger).capture("declined")


def test_a_decline_rate_of_zero_never_declines_and_one_always_does() -> None:
    never, always = processor(0.0), processor(1.0)
    for n in range(50):
        never.authorise(f"k{n}", 7, 100, CARD)
        with pytest.raises(PaymentDeclinedError):
            always.authorise(f"k{n}", 7, 100, CARD)


@pytest.mark.parametrize("rate", [-0.01, 1.01, float("nan")])
def test_a_decline_rate_outside_zero_to_one_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="from 0 to 1"):
        processor(rate)
