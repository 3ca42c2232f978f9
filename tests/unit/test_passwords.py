"""db.passwords: production hashes by default, cheap ones for the tests, each verifying under either."""
from __future__ import annotations

import pytest

from db.passwords import hash_password, verify_password


def test_a_hash_verifies_whichever_cost_made_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARKET_TEST_FAST_HASHES", "0")
    strong = hash_password("correct horse")
    monkeypatch.setenv("MARKET_TEST_FAST_HASHES", "1")
    fast = hash_password("correct horse")
    assert strong.startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert fast.startswith("$argon2id$v=19$m=64,t=1,p=1$")
    for setting in ("0", "1"):
        monkeypatch.setenv("MARKET_TEST_FAST_HASHES", setting)
        assert verify_password(strong, "correct horse") and verify_password(fast, "correct horse")
        assert not verify_password(strong, "wrong horse") and not verify_password(fast, "wrong horse")
        assert not verify_password(None, "correct horse")
