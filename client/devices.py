"""The device tokens a shell keeps (protocol 1.2): one per server and username, in a small file
readable by its owner only (~/.market_devices), sent with later logins so that the throttles
against password guessing never slow this device down.
"""
from __future__ import annotations

import json
import os


class DeviceTokens:
    """Device tokens by `ROLE HOST:PORT USERNAME`; a file that cannot be read or written is
    no token (the login goes on without one)."""

    def __init__(self, path: str = "~/.market_devices") -> None:
        self.path = os.path.expanduser(path)

    def get(self, key: str) -> str | None:
        """The token kept for this key, if any."""
        return self._read().get(key)

    def put(self, key: str, token: str) -> None:
        """Keep the token of this key (the file is made with mode 0600)."""
        tokens = self._read()
        if tokens.get(key) == token:
            return
        tokens[key] = token
        temporary = f"{self.path}.{os.getpid()}"
        try:
            with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
                json.dump(tokens, out)
            os.replace(temporary, self.path)
        except OSError:
            pass  # a read-only home: the next login simply goes without the token

    def _read(self) -> dict[str, str]:
        try:
            with open(self.path) as file:
                tokens = json.load(file)
        except (OSError, ValueError):
            return {}
        return tokens if isinstance(tokens, dict) else {}
