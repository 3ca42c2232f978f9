"""The guards' rules without I/O: the account's bucket (db.login_throttle) and the fair share
of the hashing queue (runtime.hashing), on a clock the test sets."""
from __future__ import annotations

from db.login_throttle import COMING_BACK, FAILED, NEW, AccountBucket
from runtime.hashing import FairShare, hashing_slots

BUCKET = AccountBucket(burst=5, step_s=1.0)


def admitted(bucket: AccountBucket, arrivals: list[tuple[int, int]]) -> list[int]:
    """The times (ms) of the attempts let through, each (time, lane), as claim() keeps the row."""
    units, last, let_through = 0, 0, []
    for now, lane in arrivals:
        wait_ms, after = bucket.claim(units, last, now, lane)
        if wait_ms == 0:
            units, last = after, now
            let_through.append(now)
    return let_through


def test_a_flood_from_any_number_of_addresses_gets_burst_plus_one_a_step() -> None:
    flood = [(t, t % 3) for t in range(0, 30_000, 20)]  # 50 a second, in every lane
    through = admitted(BUCKET, flood)
    assert 25 <= len(through) <= BUCKET.burst + 30, len(through)


def test_the_last_places_are_kept_for_new_addresses_and_those_coming_back() -> None:
    failed = admitted(BUCKET, [(t, FAILED) for t in range(0, 30_000, 20)])
    assert len(failed) <= BUCKET.burst - BUCKET.kept(FAILED) + 30
    full = BUCKET.burst - BUCKET.kept(FAILED)  # what guesses from failed addresses leave
    assert BUCKET.wait_ms(full, 29_990, 30_000, NEW) == 0  # a new client: in at once
    assert 0 < BUCKET.wait_ms(full, 29_990, 30_000, FAILED) <= 1000
    full = BUCKET.burst - BUCKET.kept(NEW)  # what guesses from new addresses leave
    assert BUCKET.wait_ms(full, 29_990, 30_000, COMING_BACK) == 0  # told to wait, back: in
    assert BUCKET.wait_ms(full, 29_990, 30_000, NEW) > 0


def test_no_wait_is_longer_than_a_few_steps() -> None:
    longest = max(BUCKET.wait_ms(units, 0, now, lane) for units in (0, 1, 5, 6, 5000)
                  for now in (0, 1, 999, 1000, 2500) for lane in (COMING_BACK, NEW, FAILED))
    assert longest == (BUCKET.kept(FAILED) + 1) * 1000


def test_two_flooding_addresses_leave_every_other_turn_to_a_third() -> None:
    share = FairShare(size=2)
    assert share.take("a", 0.0) == "" and share.take("b", 0.0) == ""
    assert share.take("a", 0.0) == "address_busy"  # its half
    assert share.take("c", 0.01) == "busy"  # in line
    share.give_back("a")
    assert share.take("a", 0.02) == "busy"  # c first
    assert share.take("c", 0.03) == ""
    share.give_back("b")
    assert share.take("b", 0.04) == "busy" and share.take("a", 0.05) == ""  # a was in line before b
    share.give_back("c")
    assert share.take("c", 0.06) == "busy" and share.take("b", 0.07) == ""


def test_an_address_that_does_not_come_back_leaves_the_line() -> None:
    share = FairShare(size=1, window_s=1.0)
    assert share.take("a", 0.0) == "" and share.take("gone", 0.1) == "busy"
    share.give_back("a")
    assert share.take("a", 0.5) == "busy"  # the place is kept for the one in line
    assert share.take("a", 1.2) == ""  # which left: the place is anyone's


def test_addresses_that_ask_once_keep_no_place_from_a_newcomer() -> None:
    share = FairShare(size=1)
    assert share.take("a", 0.0) == ""
    assert [share.take(f"once{n}", 0.1) for n in range(5)] == ["busy"] * 5
    share.give_back("a")
    assert share.take("a", 0.2) == "busy"  # served a moment ago: behind the line
    assert share.take("owner", 0.2) == ""  # not served lately: never behind it


def test_a_small_bucket_keeps_no_places() -> None:
    assert [AccountBucket(burst).kept(FAILED) for burst in (1, 2, 4, 5, 10)] == [0, 0, 1, 2, 5]


def test_one_address_alone_uses_its_half_and_a_setting_caps_it() -> None:
    assert FairShare(size=7).per_address == 3 and FairShare(size=1).per_address == 1
    assert FairShare(size=7, per_address=9).per_address == 7
    assert [hashing_slots(cores) for cores in (1, 2, 4, 16)] == [1, 1, 3, 15]
