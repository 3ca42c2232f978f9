"""What the shells print: items, carts, receipts and purchase history as tables of values,
shown with rich in a terminal (fitting its width), as tab-separated rows in `tsv` (sentences to
stderr), or in `json` as JSON Lines, one object per command.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from wire.values import not_text

from .fields import category_name

FORMATS = ("table", "tsv", "json")
FORMAT_HELP = ("how results are printed: table (a terminal's default); tsv (a script's default: "
               "rows only, sentences to stderr); json (JSON Lines: one object per command, "
               '{"command", "ok", "table", "rows", "messages", "error"}; read it with '
               "`python -m json.tool --json-lines`)")


@dataclass(frozen=True)
class Table:
    """A titled table of values; `empty` is said when it has no rows; `fields` go with it into a
    json document (a cart's total)."""

    title: str
    columns: tuple[str, ...]
    rows: Sequence[tuple[Any, ...]]
    empty: str
    fields: dict[str, Any] = field(default_factory=dict)


class OutputClosed(Exception):
    """Standard output is a pipe whose reader has gone (`market buyer -c ... | head -1`)."""


class Output:
    """Prints lines, errors and tables in one of FORMATS; in json, what one command prints
    (between `begin` and `end`) becomes one JSON object on one line."""

    def __init__(self, format: str, say_to_stdout: bool = False) -> None:
        self.format, self.say_to_stdout = format, say_to_stdout  # in tsv (`market admin`)
        self.console = Console(highlight=False, soft_wrap=True, emoji=False)  # ":fire:" stays as typed
        self.doc: dict[str, Any] | None = None
        self._depth = 0  # a command run by another (login again) adds to its document

    def begin(self, command: str) -> None:
        self._depth += 1
        if self.format == "json" and self._depth == 1:
            self.doc = {"command": command, "ok": True}

    def end(self) -> None:
        """A command is over: in json, print its document."""
        self._depth -= 1
        if self._depth == 0 and self.doc is not None:
            doc, self.doc = self.doc, None
            _print(json.dumps(doc, ensure_ascii=False))

    def say(self, text: str) -> None:
        """One line of ordinary output (to stderr in a script: not a row)."""
        text = printable(text)
        if self.doc is not None:
            self.doc.setdefault("messages", []).append(text)
        elif self.format == "table":
            self.console.print(text, markup=False)
        elif self.format == "tsv" and self.say_to_stdout:
            _print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def error(self, text: str) -> None:
        """One line naming a problem and what to do (to stderr in a script)."""
        text = printable(text)
        if self.doc is not None:
            self.doc.update(ok=False, error=text)
        if self.format == "table":
            self.console.print(f"error: {text}", style="bold red", markup=False)
        else:
            print(f"error: {text}", file=sys.stderr, flush=True)

    def table(self, table: Table) -> None:
        """A table, or its `empty` sentence when there are no rows (in json, an empty list)."""
        if self.format == "json":
            rows = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
            if self.doc is None:  # outside a shell's command (`market admin`): a line of its own
                _print(json.dumps({"table": table.title, "rows": rows, **table.fields}, ensure_ascii=False))
            else:
                self.doc.update(table=table.title, rows=rows, **table.fields)
        elif not table.rows:
            self.say(table.empty)
        elif self.format == "tsv":
            for row in [table.columns, *table.rows]:
                _print("\t".join(printable(cell_text(cell)) for cell in row))
        else:
            self.console.print(_rich(table))


def cell_text(value: Any) -> str:
    """A value as a table shows it: word lists joined by commas, nothing as `-`."""
    if isinstance(value, list):
        return ",".join(value)
    return "-" if value is None else str(value)


def _print(line: str) -> None:
    try:
        print(line, flush=True)
    except BrokenPipeError:
        # what is still buffered would fail again as Python exits, with a message on stderr
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise OutputClosed from None


def _rich(table: Table) -> RichTable:
    # no side borders, one space between columns (the box's divider): ten columns fit in 80
    out = RichTable(title=table.title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                    padding=0)
    for index, column in enumerate(table.columns):
        widest = max(len(cell_text(row[index])) for row in table.rows)
        header = "cond" if column == "condition" else column  # scripts keep the full names
        if column in _NUMERIC:  # never cut short: "100000…" would read as a smaller number
            out.add_column(header, justify="right", no_wrap=True, min_width=max(widest, len(header)))
        elif column == "keywords":  # a list of words: the first ones tell enough
            out.add_column(header, overflow="ellipsis", max_width=max(8, len(header)))
        elif column in _WORDS:  # a word or two (used, Collectibles): shortened only if need be
            out.add_column(header, overflow="ellipsis", min_width=len(header))
        else:  # a name: wrapped, but never narrower than a word or so
            out.add_column(header, overflow="fold", min_width=min(widest, 10))
    for row in table.rows:
        out.add_row(*(Text(printable(cell_text(cell))) for cell in row))  # Text: no markup in names
    return out


def printable(text: str) -> str:
    """Text safe to show: each character that is not text (wire.values.not_text) becomes `?`."""
    return "".join("?" if not_text(char) else char for char in text)


_WORDS = {"category", "condition", "feedback", "bought at"}
_NUMERIC = {"id", "item", "order", "price", "qty", "up", "down", "subtotal",
            "available", "seller", "when"}


def money(value: str | Decimal) -> str:
    return f"{Decimal(value):.2f}"


def items_table(items: list[dict[str, Any]], empty: str = "No items found.") -> Table:
    """Items, as search and a seller's listing return them."""
    rows = [(i["item_id"], i["name"], category_name(i["category"]), i["keywords"], i["condition"],
             money(i["price"]), i["quantity"], i["thumbs_up"], i["thumbs_down"], i["seller_id"])
            for i in items]
    columns = ("id", "name", "category", "keywords", "condition", "price", "qty", "up", "down",
               "seller")
    return Table("Items", columns, rows, empty)


def item_lines(item: dict[str, Any]) -> list[str]:
    """One item, one line per field."""
    return [f"item {item['item_id']}: {item['name']}",
            f"  price {money(item['price'])}, {item['quantity']} left, {item['condition']}",
            f"  category {category_name(item['category'])}, keywords {', '.join(item['keywords']) or '-'}",
            f"  seller {item['seller_id']}, {item['thumbs_up']} up, {item['thumbs_down']} down"]


def cart_table(cart: dict[str, Any]) -> Table:
    """The lines of a cart (its total is said apart)."""
    rows = [(line["item_id"], line["name"], money(line["price"]), line["quantity"],
             line["available"], money(Decimal(line["price"]) * line["quantity"]))
            for line in cart["items"]]
    return Table("Cart", ("item", "name", "price", "qty", "available", "subtotal"), rows,
                 "Your cart is empty.", {"total": money(cart["total"])})


def receipt_table(receipt: dict[str, Any]) -> Table:
    rows = [(line["item_id"], line["name"], line["quantity"], money(line["price"]))
            for line in receipt["lines"]]
    return Table(f"Order {receipt['order_id']}", ("item", "name", "qty", "price"), rows,
                 "Nothing was bought.", {"order_id": receipt["order_id"], "total": money(receipt["total"])})


def history_table(purchases: list[dict[str, Any]]) -> Table:
    """Purchase history, newest first."""
    rows = [(p["order_id"], p["item_id"], p["name"], p["quantity"], money(p["price"]),
             p["purchased_at"], p["feedback"]) for p in purchases]
    columns = ("order", "item", "name", "qty", "price", "bought at", "feedback")
    return Table("Purchase history", columns, rows, "No purchases yet.")


def rating_line(rating: dict[str, Any]) -> str:
    return (f"seller {rating['seller_id']}: {rating['thumbs_up']} thumbs up, "
            f"{rating['thumbs_down']} thumbs down, {rating['items_sold']} items sold")
