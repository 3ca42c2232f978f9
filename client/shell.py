"""The buyer and seller shells: one `Shell` holds the connection and login, runs command lines
through the registry and turns every failure into one line in a person's words, saying what to
do; client.loops feeds it lines, from prompt_toolkit in a terminal or from a script.
"""
from __future__ import annotations

import getpass
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prompt_toolkit import prompt as ask_line
from prompt_toolkit.completion import WordCompleter

from wire import Connection, ConnectionLostError, ProtocolError
from wire.errors import UnauthenticatedError
from wire.ops import READ_ONLY_OPS

from .lines import split_commands, utf8_text
from .registry import Arg, BadValueError, Command, RefusedError, Registry, UsageError
from .render import Output, Table

_KEEPALIVE_OPS = {"buyer": "display_cart", "seller": "get_seller_rating"}  # reads that touch a session


@dataclass
class CartMemory:
    """What the shell knows of the session's cart: its lines as last seen (none until seen in this
    session) and whether they differ from the saved cart (leaving offers to save them)."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    total: str | None = None  # as last seen: what `buy` expects to pay
    unsaved: bool = False

    def seen(self, content: dict[str, Any], unsaved: bool | None = None) -> None:
        """The server showed the cart; `unsaved`: a command changed it (True) or saved it (False)."""
        self.lines, self.total = list(content["items"]), content["total"]
        self.unsaved = self.unsaved if unsaved is None else unsaved

    def bought(self) -> None:
        """A purchase emptied the cart."""
        self.lines, self.unsaved = [], False

    def summary(self) -> str:
        """The lines in a few words: `2 x Desk lamp (item 7), 1 x Mug (item 9)`."""
        return ", ".join(f"{line['quantity']} x {line['name']} (item {line['item_id']})"
                         for line in self.lines)


@dataclass
class Shell:
    """A shell's state: connection, who is logged in, the last list; runs command lines."""

    role: str
    conn: Connection
    registry: Registry
    out: Output
    interactive: bool
    username: str | None = None
    more: Callable[[], None] | None = None  # fetches the next page of the last list
    running: bool = True
    save_on_exit: bool = False  # in a script: save an unsaved cart on the way out
    cart: CartMemory = field(default_factory=CartMemory)
    seen_ids: list[str] = field(default_factory=list)  # item ids of the last list, for completion
    busy: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one request at a time
    lost: bool = field(default=False, repr=False)
    misread: bool = field(default=False, repr=False)  # the last line had a command not understood, or not run

    def call(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request; says so when the connection had to be opened again first."""
        before, was_open = self.conn.reconnects, self.conn.is_open  # closed: by the shell itself
        try:
            result = self.conn.call(op, args)
        except OSError:
            self.lost = True
            raise
        except KeyboardInterrupt:
            self.conn.close()  # a half-sent or half-read request must not confuse the next one
            if op not in READ_ONLY_OPS:  # it may have reached the server, and been done there
                raise ConnectionLostError(f"interrupted during {op}; it may or may not have been "
                                          "applied") from None
            raise
        if self.lost or (self.conn.reconnects > before and was_open):
            self.out.say(f"(reconnected to the {self.role} server at {self.address})")
        self.lost = False
        return result

    @property
    def address(self) -> str:
        return f"{self.conn.host}:{self.conn.port}"

    def page(self, op: str, args: dict[str, Any], to_table: Callable[[dict[str, Any]], Table]) -> None:
        """Run a list op, show its page and remember where the next page starts."""
        result = self.call(op, {key: value for key, value in args.items() if value is not None})
        self.out.table(to_table(result))
        rows = result.get("items", result.get("purchases", []))
        self.seen_ids = list(dict.fromkeys(str(row["item_id"]) for row in rows))
        cursor = result.get("next_cursor")
        self.more = (lambda: self.page(op, {**args, "cursor": cursor}, to_table)) if cursor else None
        if cursor:
            self.out.say("There is more: type `more`.")

    def set_session(self, username: str | None = None, token: str | None = None) -> None:
        """Remember a new session, or none: log out (the server side is the caller's business)."""
        self.conn.token, self.username, self.more = token, username, None
        self.cart = CartMemory()  # a new session's cart starts as the saved cart

    def ask(self, arg: Arg, problem: str = "") -> str:
        """Ask for an argument until the answer is valid (or empty), saying first why it is asked
        again; secrets without echo, checked before they are asked a second time."""
        while True:
            if problem:
                self.out.error(f"{arg.label}: {problem}; try again (an empty answer or Ctrl-C cancels)")
            value = self._read(arg, f"{arg.label}{'' if arg.required else ' (Enter: none)'}: ")
            try:
                if value:
                    arg.convert(value)
                    if arg.confirm and self._read(arg, f"{arg.label} again: ") != value:
                        raise ValueError(f"the two {arg.label}s differ")
                return value
            except ValueError as exc:
                problem = str(exc)

    def _read(self, arg: Arg, prompt: str) -> str:
        if arg.secret:
            return getpass.getpass(prompt)
        completer = WordCompleter(list(arg.choices), ignore_case=True) if arg.choices else None
        return ask_line(prompt, completer=completer).strip()

    def confirm(self, question: str) -> bool:
        """A yes-or-no question, yes by default."""
        answer = ask_line(f"{question} [Y/n] ").strip().lower()
        return answer in ("", "y", "yes")

    def offer_to_save(self) -> None:
        """Before a session ends: save an unsaved cart if the person says so (yes by default),
        or in a script if --save-on-exit asks for it."""
        if self.conn.token is None or not self.cart.unsaved:
            return
        keep = self.save_on_exit
        if self.interactive:
            try:
                keep = self.confirm(f"Your cart ({self.cart.summary() or 'an emptied cart'}) is not "
                                    "saved. Save your cart?")
            except EOFError:
                keep = True
        if keep:
            self.save_cart()

    def save_cart(self) -> None:
        saved = self.call("save_cart")["cart"]
        self.cart.seen(saved, unsaved=False)
        self.out.say(f"Cart saved: {len(saved['items'])} item(s), total {saved['total']}.")

    def run_line(self, line: str) -> bool:
        """Run the `;`-separated commands of a line; False at the first that fails."""
        self.misread = False
        try:
            commands = split_commands(utf8_text(line))
        except ValueError as exc:
            self.out.error(f"cannot read the line: {exc}")
            self.misread = True
            return False
        return all(self.execute(words) for words in commands if self.running)

    def execute(self, words: list[str]) -> bool:
        """Run one command; print any failure as one line saying what to do; False then."""
        command = self.registry.commands.get(words[0])
        self.out.begin(words[0])
        try:
            self._dispatch(self.registry.get(words[0]), words[1:])
            return True
        except BadValueError as exc:
            self.out.error(f"{exc}; `help {words[0]}` says what it takes")
            self.misread = True
        except UsageError as exc:
            self.out.error(f"{exc} (usage: {command.usage})" if command else str(exc))
            self.misread = True
        except (RefusedError, ConnectionLostError) as exc:
            self.out.error(str(exc))
        except UnauthenticatedError as exc:
            self._unauthenticated(exc)
        except ProtocolError as exc:
            self.out.error(in_plain_words(exc, self.role))
        except OSError as exc:
            self.out.error(f"cannot reach the {self.role} server at {self.address}: "
                           f"{exc.strerror or exc}; is it running? (`market serve` starts one)")
        except (KeyboardInterrupt, EOFError) as exc:
            if isinstance(exc, KeyboardInterrupt) and not self.interactive:  # a script stops (sh's status)
                raise
            self.out.error("cancelled")
        finally:
            self.out.end()
        return False

    def _dispatch(self, command: Command, words: list[str]) -> None:
        if command.login and self.conn.token is None:  # not run, nor its words read: kept out of history
            self.misread = True
            raise RefusedError(f"you are not logged in; `{command.name}` needs "
                               "`login USERNAME` or `signup USERNAME` first")
        # a line that does not fit is refused before any request; in a script, a value that is
        # not valid too (in a terminal, it is asked for again, after the check)
        values = None if self.interactive else command.values(words, None)
        command.parse(words)
        if command.check is not None:
            command.check(self)
        command.handler(self, values if values is not None else command.values(words, self.ask))

    def _unauthenticated(self, exc: ProtocolError) -> None:
        # a refused `login` arrives as RefusedError, so a session is only on hand here when
        # a request made in it (`more`'s too) was refused: it has expired or ended
        if self.username is None:
            self.out.error(exc.message)
            return
        name, lost = self.username, self.cart.lines
        had = f"; your cart held {self.cart.summary()}" if lost else ""
        self.set_session()
        self.out.error(f"your session has expired or ended{had}; please log in again: login {name}")
        if not (self.interactive and lost):
            return
        try:  # log in again (asking the password) and add the lines of the lost cart again
            if self.confirm(f"Log in again as {name} and put the cart back?"):
                password = self.ask(Arg("password", secret=True), "")
                if password and self.execute(["login", name, "--password", password]):
                    for line in lost:
                        self.execute(["add", str(line["item_id"]), str(line["quantity"])])
        except (KeyboardInterrupt, EOFError):
            self.out.error("cancelled")

    def end_session(self) -> None:
        """Log out if logged in, ignoring failures (the session may be gone already)."""
        if self.conn.token is not None:
            try:
                self.conn.call("logout")
            except (OSError, ProtocolError):
                pass
            except KeyboardInterrupt:
                self.conn.close()  # its answer must not be read as the next request's
                raise
        self.set_session()

    def refresh_quietly(self) -> None:
        """A quiet request that keeps the connection and the session alive (a buyer's reads the
        cart, remembered should the session expire anyway)."""
        op = _KEEPALIVE_OPS.get(self.role, "ping") if self.conn.token else "ping"
        try:
            result = self.conn.call(op)
        except (OSError, ProtocolError):
            return  # the next command meets the same problem, and says so
        if op == "display_cart":
            self.cart.seen(result["cart"])

    def leave(self) -> None:
        """Offer to save an unsaved cart, end the session and close (quit, Ctrl-D, the end of a
        script; Ctrl-C while it waits: just close, the server ends the session when it expires)."""
        try:
            self.offer_to_save()
        except (OSError, ProtocolError, ConnectionLostError) as exc:
            self.out.error(f"the cart could not be saved: {exc}")
        except KeyboardInterrupt:
            self.out.error("cancelled: the cart was not saved")
        try:
            self.end_session()
        except KeyboardInterrupt:
            self.set_session()
        self.conn.close()


# What each error code of the contract means to a person, and what to do; `{message}` is the
# server's own sentence, which names the item or the field.
_IN_PLAIN_WORDS = {
    "BAD_REQUEST": "{message}; `help` says what each command takes",
    "UNKNOWN_OP": "the server does not know this command: is it the {role} server?",
    "FORBIDDEN": "{message}",
    "NOT_FOUND": "{message}: check the number (a list such as `{listing}` shows them)",
    "CONFLICT": "{message}",
    "PAYMENT_DECLINED": "the card was declined ({message}); nothing was charged: try another card",
    "BUSY": "the server is busy right now; nothing was done: try again in a moment",
    "UNAVAILABLE": "the server cannot reach its database right now; nothing was changed: "
                   "try again in a moment",
}


def in_plain_words(exc: ProtocolError, role: str) -> str:
    """An error answer as a sentence without its protocol code, saying what to do."""
    template = _IN_PLAIN_WORDS.get(exc.code, "the server failed ({message}): try again; if it "
                                             "fails again, tell the marketplace's operator")
    listing = "search" if role == "buyer" else "items"
    return template.format(message=exc.message, role=role, listing=listing)
