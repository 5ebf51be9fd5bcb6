"""API-key minting and hashing (pure)."""

from __future__ import annotations

import hashlib
import re

from controlplane.services.keys import KEY_PREFIX, PREFIX_LENGTH, generate_key, hash_key


def test_keys_are_prefixed_urlsafe_and_256_bit() -> None:
    keys = {generate_key() for _ in range(100)}
    assert len(keys) == 100
    for key in keys:
        assert re.fullmatch(r"gp_[A-Za-z0-9_-]{43}", key)
        assert key.startswith(KEY_PREFIX)
    assert len({k[:PREFIX_LENGTH] for k in keys}) == 100


def test_hash_is_hex_sha256_of_the_whole_key() -> None:
    key = generate_key()
    assert hash_key(key) == hashlib.sha256(key.encode()).hexdigest()
    assert len(hash_key(key)) == 64
