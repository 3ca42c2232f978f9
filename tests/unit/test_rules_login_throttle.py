"""The login throttles on a clock the test sets: the account's bucket (db.login_throttle), each
claim as claim() applies it to the account's row, the waits it tells and the places kept per
lane; and the limits of an address (runtime.logins): free failures, then waits doubling."""
from __future__ import annotations

import itertools

import pytest

from db.login_throttle import COMING_BACK, FAILED, NEW, AccountBucket
from runtime.logins import Backoff, Waits
from wire.errors import UnauthenticatedError

LANES = (COMING_BACK, NEW, FAILED)
BUCKETS = [AccountBucket(), AccountBucket(burst=1, step_s=1.0), AccountBucket(burst=2, step_s=0.5),
           AccountBucket(burst=10, step_s=3.0)]


def test_an_empty_bucket_takes_an_attempt_of_any_lane() -> None:
    for bucket, lane in itertools.product(BUCKETS, LANES):
        assert bucket.claim(0, 0, 0, lane) == (0, 1)


def test_a_claim_adds_one_unit_to_what_is_left_of_the_bucket() -> None:
    bucket = AccountBucket(burst=5, step_s=1.0)
    assert bucket.claim(3, 0, 999, COMING_BACK) == (0, 4)  # nothing drained yet
    assert bucket.claim(3, 0, 1000, COMING_BACK) == (0, 3)  # one unit drained
    assert bucket.claim(3, 0, 60_000, FAILED) == (0, 1)  # drained empty, never below
    assert bucket.claim(500, 0, 0, COMING_BACK) == (1000, 500)  # past the burst: full, a step


def test_a_full_bucket_refuses_and_keeps_its_count() -> None:
    for bucket, lane in itertools.product(BUCKETS, LANES):
        wait_ms, units = bucket.claim(bucket.burst, 1000, 1000, lane)
        assert wait_ms > 0 and units == bucket.burst


@pytest.mark.parametrize("bucket", BUCKETS)
def test_the_wait_told_is_exact(bucket: AccountBucket) -> None:
    """Asked again once the wait is over, the attempt fits; a millisecond earlier, it does not."""
    step = bucket.step_ms
    for units, elapsed, lane in itertools.product(range(bucket.burst + 2), range(0, 3 * step, step // 4 + 1),
                                                  LANES):
        wait_ms, _ = bucket.claim(units, 0, elapsed, lane)
        if wait_ms:
            assert bucket.claim(units, 0, elapsed + wait_ms, lane)[0] == 0, (units, elapsed, lane)
            assert bucket.claim(units, 0, elapsed + wait_ms - 1, lane)[0] > 0, (units, elapsed, lane)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_clients_coming_back_wait_least_and_failed_addresses_most(bucket: AccountBucket) -> None:
    assert bucket.kept(COMING_BACK) == 0 <= bucket.kept(NEW) <= bucket.kept(FAILED) < bucket.burst
    for units, now in itertools.product(range(bucket.burst + 1), range(0, 4000, 250)):
        back, new, failed = (bucket.claim(units, 0, now, lane)[0] for lane in LANES)
        assert back <= new <= failed, (units, now)


def test_an_account_flooded_for_a_minute_checks_at_most_burst_plus_one_password_a_step() -> None:
    bucket = AccountBucket(burst=5, step_s=1.25)
    units, last, checked = 0, 0, 0
    for now in range(0, 60_000, 7):  # every 7 ms, from addresses whose passwords were wrong
        wait_ms, after = bucket.claim(units, last, now, FAILED)
        if wait_ms == 0:
            units, last, checked = after, now, checked + 1
    assert checked <= bucket.burst + 60_000 // bucket.step_ms
    assert checked >= 60_000 // bucket.step_ms - 1  # and it keeps taking them, one a step


def test_a_step_under_a_millisecond_still_drains() -> None:
    bucket = AccountBucket(burst=1, step_s=0.0)
    assert bucket.step_ms == 1
    assert bucket.claim(1, 0, 0, NEW)[0] == 1 and bucket.claim(1, 0, 1, NEW) == (0, 1)


class FakeClock:
    """A monotonic clock that moves when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def backoff(clock: FakeClock, free: int = 2, max_delay_s: float = 900) -> Backoff:
    return Backoff(free, max_delay_s, "too many login attempts", "throttled", clock=clock)


def test_past_the_free_failures_each_attempt_waits_twice_as_long_after_the_last() -> None:
    clock = FakeClock()
    limit = backoff(clock, free=2, max_delay_s=8)
    assert [limit.claim("key", "ann") for _ in range(2)] == [0, 1]  # free, at once
    waits = []
    for _ in range(6):
        with pytest.raises(UnauthenticatedError, match=r"^too many login attempts; try again in \d+ s$"):
            limit.claim("key", "ann")
        start = clock.now
        while True:
            clock.now += 0.25
            try:
                limit.claim("key", "ann")
                break
            except UnauthenticatedError:
                pass
        waits.append(clock.now - start)
    assert waits == [1, 2, 4, 8, 8, 8]  # up to the longest delay


def test_a_refused_attempt_is_not_counted_and_says_how_long_to_wait() -> None:
    clock = FakeClock()
    limit = backoff(clock, free=1)
    assert limit.claim("key", "ann") == 0
    clock.now += 0.4
    for _ in range(5):
        with pytest.raises(UnauthenticatedError, match="try again in 1 s$"):
            limit.claim("key", "ann")
    clock.now += 0.6  # a second after the last counted attempt, however many were refused
    assert limit.claim("key", "ann") == 1


def test_with_no_free_failures_a_first_attempt_goes_at_once_and_the_next_waits() -> None:
    clock = FakeClock()
    limit = backoff(clock, free=0)  # before: every attempt "must wait 1 s", a login never got in
    assert limit.claim("key", "ann") == 0  # no failure before it to wait after
    with pytest.raises(UnauthenticatedError, match="try again in 2 s$"):  # the doubling goes on
        limit.claim("key", "ann")
    clock.now += 2
    assert limit.claim("key", "ann") == 1
    limit.succeeded("key", clear=True)
    assert limit.claim("key", "ann") == 0  # cleared: a first attempt again


def test_each_key_counts_its_own_failures() -> None:
    clock = FakeClock()
    limit = backoff(clock, free=1)
    assert limit.claim(("1.2.3.4", "buyer", "ann"), "ann") == 0
    assert limit.claim(("1.2.3.4", "buyer", "bob"), "bob") == 0
    assert limit.claim(("5.6.7.8", "buyer", "ann"), "ann") == 0
    with pytest.raises(UnauthenticatedError):
        limit.claim(("1.2.3.4", "buyer", "ann"), "ann")


def test_a_right_login_clears_its_key_or_takes_back_only_its_own_attempt() -> None:
    clock = FakeClock()
    limit = backoff(clock, free=3)
    for key in ("cleared", "taken back"):
        assert [limit.claim(key, "ann") for _ in range(3)] == [0, 1, 2]
    limit.succeeded("cleared", clear=True)
    limit.succeeded("taken back", clear=False)
    assert limit.claim("cleared", "ann") == 0
    assert limit.claim("taken back", "ann") == 2  # the guesses before it still count
    limit.succeeded("never claimed", clear=False)  # changes nothing, fails nothing
    assert limit.claim("never claimed", "ann") == 0


def test_a_failure_count_far_past_the_free_ones_waits_the_longest_delay_without_overflow() -> None:
    clock = FakeClock()
    limit = backoff(clock, free=1, max_delay_s=1)
    assert limit.claim("key", "ann") == 0
    for n in range(1, 1200):  # 2.0 ** 1024 would raise OverflowError
        clock.now += 1
        assert limit.claim("key", "ann") == n
    with pytest.raises(UnauthenticatedError, match="try again in 1 s$"):
        limit.claim("key", "ann")


def test_a_client_told_to_wait_counts_as_coming_back_only_once_it_waited_and_for_a_while() -> None:
    clock = FakeClock()
    waits = Waits(ttl_s=60, clock=clock)
    assert not waits.waited("key")
    waits.told("key", 3)
    clock.now += 2.9
    assert not waits.waited("key")  # came back too soon
    clock.now += 0.1
    assert waits.waited("key") and not waits.waited("other key")
    clock.now += 59.9
    assert waits.waited("key")
    clock.now += 0.1
    assert not waits.waited("key")  # an hour later it is a new client again
