"""The rules of sessions (db.accounts) on a clock the test sets: when a session expires, when
its last-seen is written again, which rows the clean-up may delete, and which sessions a
login ends."""
from __future__ import annotations

import hashlib
import random
from types import SimpleNamespace

import pytest

from db.accounts import CLEANUP_GRACE_MS, MAX_SESSIONS, SessionPolicy, sessions_to_end, token_hash

POLICY = SessionPolicy(idle_s=300, max_s=86400)


@pytest.mark.parametrize(("idle_s", "interval_ms"), [(300, 5000), (50, 5000), (49, 4900), (20, 2000),
                                                     (1, 100)])
def test_last_seen_is_written_every_five_seconds_or_a_tenth_of_the_idle_timeout(
        idle_s: int, interval_ms: int) -> None:
    assert SessionPolicy(idle_s=idle_s).touch_interval_ms == interval_ms


def test_a_session_expires_once_idle_past_its_timeout_and_the_lag_of_last_seen() -> None:
    idle_end = 300_000 + 5000
    assert not POLICY.expired(now=idle_end, created_ms=0, last_seen_ms=0)
    assert POLICY.expired(now=idle_end + 1, created_ms=0, last_seen_ms=0)


def test_a_session_expires_its_max_age_after_login_however_busy() -> None:
    day = 86_400_000
    assert not POLICY.expired(now=day, created_ms=0, last_seen_ms=day)
    assert POLICY.expired(now=day + 1, created_ms=0, last_seen_ms=day + 1)


def test_last_seen_is_due_once_a_touch_interval_old() -> None:
    assert not POLICY.touch_due(now=4999, last_seen_ms=0)
    assert POLICY.touch_due(now=5000, last_seen_ms=0)
    assert POLICY.touch_due(now=10**12, last_seen_ms=0)


@pytest.mark.parametrize("idle_s", [1, 7, 60, 300])
@pytest.mark.parametrize("seed", range(5))
def test_a_session_ends_within_a_touch_interval_after_the_idle_timeout_never_earlier(
        idle_s: int, seed: int) -> None:
    """Requests at random moments write last-seen only when due, as Session.accept does: the
    session lives through every gap up to the idle timeout, and ends by the timeout plus the
    touch interval after its last request."""
    policy, rng = SessionPolicy(idle_s=idle_s, max_s=10**6), random.Random(seed)
    idle_ms, now = idle_s * 1000, 0
    last_seen = 0
    for _ in range(300):
        now += rng.choice([1, rng.randrange(policy.touch_interval_ms * 2), rng.randrange(idle_ms + 1)])
        assert not policy.expired(now, 0, last_seen), (now, last_seen)
        if policy.touch_due(now, last_seen):
            last_seen = now
    assert not policy.expired(now + idle_ms, 0, last_seen)
    assert policy.expired(now + idle_ms + policy.touch_interval_ms + 1, 0, last_seen)


@pytest.mark.parametrize("policy", [POLICY, SessionPolicy(idle_s=1, max_s=2),
                                    SessionPolicy(idle_s=60, max_s=30)])
def test_the_clean_up_deletes_only_sessions_that_ended_a_grace_period_ago(policy: SessionPolicy) -> None:
    now = 10**9
    seen_before, created_before = policy.ended_before(now)
    idle_end = policy.idle_s * 1000 + policy.touch_interval_ms
    moments = sorted({now - base - extra
                      for base in (0, 1, 1000, policy.touch_interval_ms, policy.idle_s * 1000, idle_end,
                                   policy.max_s * 1000)
                      for extra in (0, CLEANUP_GRACE_MS - 1, CLEANUP_GRACE_MS, CLEANUP_GRACE_MS + 1)})
    deleted = 0
    for created in moments:
        for last_seen in (m for m in moments if m >= created):
            if last_seen < seen_before or created < created_before:
                deleted += 1
                # ended by the grace period's start: no read accepted then still runs
                assert policy.expired(now - CLEANUP_GRACE_MS, created, last_seen), (created, last_seen)
    assert deleted
    just_ended = now - idle_end - 1
    assert policy.expired(now, now, just_ended) and not just_ended < seen_before  # kept a while


def sessions(*ended: bool) -> list[SimpleNamespace]:
    """An account's sessions as the login reads them, newest (the highest id) first."""
    return [SimpleNamespace(session_id=len(ended) - n, ended=e) for n, e in enumerate(ended)]


def test_a_login_ends_nothing_while_the_account_has_room_for_its_session() -> None:
    assert sessions_to_end(sessions(*[False] * (MAX_SESSIONS - 1))) == ([], [])
    assert sessions_to_end([]) == ([], [])


def test_a_login_at_the_limit_ends_the_oldest_live_sessions_and_every_ended_one() -> None:
    assert MAX_SESSIONS == 20
    found = sessions(*[False] * 10, True, *[False] * 15, True)  # ids 27 (newest) down to 1
    candidates, over = sessions_to_end(found)
    assert over == [7, 6, 5, 4, 3, 2]  # 25 live: the 19 newest stay, with the new one 20
    assert candidates == [17, 1, *over]
    assert sessions_to_end(sessions(*[True] * 30)) == (list(range(30, 0, -1)), [])


def test_a_token_is_kept_as_its_sha256_even_when_not_valid_utf8() -> None:
    assert token_hash("abc") == hashlib.sha256(b"abc").hexdigest()
    lone = token_hash("\ud800")  # JSON may carry a lone surrogate: it hashes, it does not fail
    assert len(lone) == 64 and lone != token_hash("\ud801") and lone != token_hash("")


def test_the_policy_is_the_settings() -> None:
    settings = SimpleNamespace(session_idle_s=42, session_max_s=4200)
    assert SessionPolicy.from_settings(settings) == SessionPolicy(idle_s=42, max_s=4200)
