"""What a buyer's shell knows of the session's cart: its last known lines and whether they
differ from the saved cart, so that leaving can offer to save it and an expired session can
say what was in it and put it back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class CartMemory:
    """The cart as last seen (None: not seen in this session) and whether it is unsaved."""

    lines: list[dict[str, Any]] | None = None
    total: str | None = None  # as last seen: what `buy` expects to pay
    unsaved: bool = False

    def seen(self, content: dict[str, Any], unsaved: bool | None = None) -> None:
        """The server showed the cart; `unsaved`: a command changed it (True) or saved it (False)."""
        self.lines, self.total = list(content["items"]), content["total"]
        self.unsaved = self.unsaved if unsaved is None else unsaved

    def bought(self) -> None:
        """A purchase emptied the cart."""
        self.lines, self.unsaved = [], False

    def forget(self) -> None:
        """A new session, or none: its cart starts as the saved cart."""
        self.lines, self.unsaved = None, False

    def summary(self) -> str:
        """The lines in a few words: `2 x Desk lamp (item 7), 1 x Mug (item 9)`."""
        return ", ".join(f"{line['quantity']} x {line['name']} (item {line['item_id']})"
                         for line in self.lines or [])

    def to_restore(self) -> list[tuple[int, int]]:
        """(item_id, quantity) of each line, to put the cart back in a new session."""
        return [(line["item_id"], line["quantity"]) for line in self.lines or []]
