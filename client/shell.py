"""The buyer and seller shells: one `Shell` holds the connection and login, runs command lines
through the registry and turns every failure into one line; two small loops feed it lines,
from prompt_toolkit in a terminal or from `-c` / standard input in script mode.
"""
from __future__ import annotations

import getpass
import os
import re
import shlex
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit import prompt as ask_line
from prompt_toolkit.completion import WordCompleter
from prompt_toolkit.history import FileHistory

from wire import Connection, ConnectionLostError, ProtocolError
from wire.errors import UnauthenticatedError
from wire.ops import READ_ONLY_OPS

from .cart import CartMemory
from .completion import LineCompleter
from .registry import Arg, Command, RefusedError, Registry, UsageError
from .render import Output, OutputClosed, Table

_KEEPALIVE_OPS = {"buyer": "display_cart", "seller": "get_seller_rating"}  # reads that touch a session

# The exit status when the reader of the output went away (`| head -1`): a command killed by
# SIGPIPE has 141 in sh; the commands after the one cut short have not run.
OUTPUT_CLOSED = 141


@dataclass
class Pager:
    """The last list command, so that `more` can fetch its next page."""

    op: str
    args: dict[str, Any]
    to_table: Callable[[dict[str, Any]], Table]
    cursor: str | None


@dataclass
class Shell:
    """A shell's state: connection, who is logged in, the last list; runs command lines."""

    role: str
    conn: Connection
    registry: Registry
    out: Output
    interactive: bool
    username: str | None = None
    pager: Pager | None = None
    running: bool = True
    save_on_exit: bool = False  # in a script: save an unsaved cart on the way out
    cart: CartMemory = field(default_factory=CartMemory)
    seen_ids: list[str] = field(default_factory=list)  # item ids of the last list, for completion
    busy: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one request at a time
    lost: bool = field(default=False, repr=False)
    misread: bool = field(default=False, repr=False)  # the last line had a command not understood, or not run

    def prompt_text(self) -> str:
        """The prompt: who is logged in, on which server."""
        return f"{self.username}@{self.role}> " if self.username else f"{self.role}> "

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
        """HOST:PORT of the server."""
        return f"{self.conn.host}:{self.conn.port}"

    def page(self, op: str, args: dict[str, Any], to_table: Callable[[dict[str, Any]], Table]) -> None:
        """Run a list op, show its page and remember where the next page starts."""
        result = self.call(op, {key: value for key, value in args.items() if value is not None})
        self.out.table(to_table(result))
        rows = result.get("items", result.get("purchases", []))
        self.seen_ids = list(dict.fromkeys(str(row["item_id"]) for row in rows))
        self.pager = Pager(op, args, to_table, result.get("next_cursor"))
        if self.pager.cursor:
            self.out.say("There is more: type `more`.")

    def log_in(self, username: str, token: str) -> None:
        """Remember a new session."""
        self.conn.token, self.username, self.pager = token, username, None
        self.cart.forget()

    def log_out(self) -> None:
        """Forget the session (the server side is the caller's business)."""
        self.conn.token, self.username, self.pager = None, None, None
        self.cart.forget()

    def ask(self, arg: Arg) -> str:
        """Ask for a missing argument until the answer is valid (or empty); secrets without echo."""
        while True:
            value = self._read_answer(arg)
            try:
                if value:
                    arg.convert(value)
                return value
            except ValueError as exc:
                self.out.error(f"{arg.label}: {exc}; try again (an empty answer or Ctrl-C cancels)")

    def _read_answer(self, arg: Arg) -> str:
        if not arg.secret:
            completer = WordCompleter(list(arg.choices), ignore_case=True) if arg.choices else None
            return ask_line(f"{arg.label}: ", completer=completer).strip()
        while True:
            value = getpass.getpass(f"{arg.label}: ")
            if not (arg.confirm and value) or getpass.getpass(f"{arg.label} again: ") == value:
                return value
            self.out.error(f"the two {arg.label}s differ; try again")

    def confirm(self, question: str) -> bool:
        """A yes-or-no question, yes by default."""
        answer = ask_line(f"{question} [Y/n] ").strip().lower()
        return answer in ("", "y", "yes")

    def offer_to_save(self) -> None:
        """Before a session ends: save an unsaved cart if the person says so (yes by default),
        or in a script if --save-on-exit asks for it."""
        if self.conn.token is None or not self.cart.worth_saving():
            return
        if self.interactive:
            shown = self.cart.summary() or "an emptied cart"
            try:
                keep = self.confirm(f"Your cart ({shown}) is not saved. Save your cart?")
            except EOFError:
                keep = True
        else:
            keep = self.save_on_exit
        if keep:
            saved = self.call("save_cart")["cart"]
            self.cart.saved(saved)
            self.out.say(f"Cart saved: {len(saved['items'])} item(s).")

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
        """Run one command; print any failure as one line and return False."""
        command = self.registry.find(words[0])
        try:
            self._dispatch(self.registry.get(words[0]), words[1:])
            return True
        except UsageError as exc:
            self.out.error(f"{exc} (usage: {command.usage})" if command else str(exc))
            self.misread = True
        except RefusedError as exc:
            self.out.error(str(exc))
        except UnauthenticatedError as exc:
            self._unauthenticated(exc)
        except ProtocolError as exc:
            self.out.error(f"{exc.code}: {exc.message}")
        except ConnectionLostError as exc:
            self.out.error(str(exc))
        except OSError as exc:
            self.out.error(f"cannot reach the {self.role} server at {self.address}: "
                           f"{exc.strerror or exc}")
        except KeyboardInterrupt:
            if not self.interactive:  # a script stops, with sh's status for Ctrl-C
                raise
            self.out.error("cancelled")
        except EOFError:
            self.out.error("cancelled")
        return False

    def _dispatch(self, command: Command, words: list[str]) -> None:
        if command.login and self.conn.token is None:  # not run, nor its words read: kept out of history
            self.misread = True
            raise UnauthenticatedError(f"you are not logged in; `{command.name}` needs "
                                       "`login USERNAME` or `signup USERNAME` first")
        command.check_given(words)  # a line that does not fit is refused before any request
        if command.check is not None:
            command.check(self)
        values = command.values(words, self.ask if self.interactive else None)
        command.handler(self, values)

    def _unauthenticated(self, exc: ProtocolError) -> None:
        # a refused `login` arrives as LoginRefusedError, so a session is only on hand here when
        # a request made in it (`more`'s too) was refused: it has expired or ended
        if self.username is None:
            self.out.error(f"{exc.code}: {exc.message}")
            return
        name, lost = self.username, self.cart.to_restore()
        had = f"; your cart held {self.cart.summary()}" if lost else ""
        self.log_out()
        self.out.error(f"{exc.code}: your session has expired or ended{had}; "
                       f"please log in again: login {name}")
        if self.interactive and lost:
            try:
                if self.confirm(f"Log in again as {name} and put the cart back?"):
                    self.log_in_again(name, lost)
            except (KeyboardInterrupt, EOFError):
                self.out.error("cancelled")

    def log_in_again(self, name: str, lines: list[tuple[int, int]]) -> None:
        """Log in as `name` (asking the password) and add the lines of a lost cart again."""
        password = self.ask(Arg("password", secret=True))
        if not password or not self.execute(["login", name, "--password", password]):
            return
        for item_id, quantity in lines:
            self.execute(["add", str(item_id), str(quantity)])

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
        self.log_out()

    def refresh_quietly(self) -> None:
        """A request that keeps the connection and the session alive, printing nothing; a
        buyer's is a look at the cart, remembered for the day the session expires anyway."""
        op = _KEEPALIVE_OPS.get(self.role, "ping") if self.conn.token else "ping"
        try:
            result = self.conn.call(op)
        except (OSError, ProtocolError):
            return  # the next command meets the same problem, and says so
        if op == "display_cart":
            self.cart.seen(result["cart"])

    def leave(self) -> None:
        """Offer to save an unsaved cart, then close (quit, Ctrl-D, the end of a script)."""
        try:
            self.offer_to_save()
        except (OSError, ProtocolError, ConnectionLostError) as exc:
            self.out.error(f"the cart could not be saved: {exc}")
        except KeyboardInterrupt:
            self.out.error("cancelled: the cart was not saved")
        self.close()

    def close(self) -> None:
        """End the session and close the connection (Ctrl-C while it waits: just close; the
        server ends the session when it expires)."""
        try:
            self.end_session()
        except KeyboardInterrupt:
            self.log_out()
        self.conn.close()


def utf8_text(line: str) -> str:
    """The line, if it came from UTF-8 bytes (else the bytes that were not are surrogates in it)."""
    try:
        line.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(f"it is not UTF-8 text (character {exc.start + 1})") from None
    return line


def split_commands(line: str) -> list[list[str]]:
    """The commands of a line: shell-like words, `;` between commands, `#` starts a comment.

    The line is cut at each `;` outside quotes (a quoted `";"` is a word, as in sh), and each
    piece split into words; empty pieces (`;;`) are skipped."""
    text = with_backslash_commands(without_comment(line))
    cuts = [index for index in _bare(text) if text[index] == ";"]
    pieces = [text[start + 1:end] for start, end in zip([-1, *cuts], [*cuts, len(text)], strict=True)]
    return [words for words in map(_words, pieces) if words]


def _words(piece: str) -> list[str]:
    lexer = shlex.shlex(piece, posix=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    return list(lexer)


def without_comment(line: str) -> str:
    """The line up to a `#` that begins a word outside quotes, as in sh: `search c#` keeps it.

    (shlex's own comments also begin inside a word, and would make `c#` a `c`.)
    """
    previous = -1
    for index in _bare(line):
        if line[index] == "#" and (index == 0 or (previous == index - 1 and line[previous] in _WORD_ENDS)):
            return line[:index]
        previous = index
    return line


def with_backslash_commands(line: str) -> str:
    """The line with a backslash doubled where a command is `\\q`, which shlex would make `q`."""
    bare = set(_bare(line))
    for match in reversed(list(_BACKSLASH_COMMAND.finditer(line))):
        backslash = match.start(2)
        if backslash in bare and (not match.group(1) or match.start(1) in bare):
            line = line[:backslash] + "\\" + line[backslash:]
    return line


_WORD_ENDS = frozenset(" \t\n\r;")  # shlex's whitespace (not \f or \v), and `;`
_BACKSLASH_COMMAND = re.compile(r"(^|;)\s*(?:(?:help|\?)\s+)?(\\)q(?=[\s;]|$)")  # `help \q` too


def _bare(line: str) -> Iterator[int]:
    """Where the characters outside quotes and not escaped by a backslash are."""
    quote, escaped = "", False
    for index, char in enumerate(line):
        if escaped:
            escaped = False
        elif quote:
            quote = "" if char == quote else quote
            escaped = char == "\\" and quote == '"'
        else:
            yield index
            escaped = char == "\\"
            quote = char if char in "'\"" else ""


_SECRET_FLAGS = ("--password", "--card-number")


def carries_a_secret(line: str) -> bool:
    """Whether a word of the line, as the shell reads it (quotes and backslashes undone), is a
    password or card-number flag (`-p`, `-pSECRET`, `--password=...`); an unreadable line too."""
    try:
        words = [word for command in split_commands(line) for word in command]
    except ValueError:
        return True
    return any(word.startswith("-p") or word.startswith(_SECRET_FLAGS) for word in words)


class SecretFreeHistory(FileHistory):
    """File history that never records a line carrying a password or a card number.

    A line is written to the file only once the shell has understood and run it (`settle`):
    a password typed where a word was expected (`login bob hunter2`) stays out of it too.
    """

    _held: str | None = None
    _unwritable = False

    def store_string(self, string: str) -> None:
        """Hold the line until `settle` (prompt_toolkit calls this as Enter is pressed)."""
        self._held = None if carries_a_secret(string) else string

    def settle(self, understood: bool) -> None:
        """Write the held line to the file if the shell understood every command in it."""
        held, self._held = self._held, None
        if held is None or not understood or self._unwritable:
            return
        try:
            super().store_string(held)
        except OSError as exc:  # no such folder, read-only, disk full: the session matters more
            self._unwritable = True
            print(f"warning: cannot write the history file {os.fsdecode(self.filename)}: "
                  f"{exc.strerror or exc}; going on without saving history", file=sys.stderr, flush=True)


def run_interactive(shell: Shell, history_file: str, keepalive_s: float) -> int:
    """The REPL: read a line, run it, until `quit`, Ctrl-D or Ctrl-C twice on an empty line;
    meanwhile a quiet request every `keepalive_s` keeps the session alive (0: none)."""
    history = SecretFreeHistory(history_file)
    session: PromptSession[str] = PromptSession(
        history=history, completer=LineCompleter(shell.registry, lambda: shell.seen_ids))
    _greet(shell)
    keepalive = Keepalive(shell, keepalive_s)
    interrupted = False
    while shell.running:
        try:
            with keepalive.while_idle():
                line = session.prompt(shell.prompt_text())
        except KeyboardInterrupt:
            if session.default_buffer.text or not interrupted:
                interrupted = not session.default_buffer.text
                if interrupted:
                    shell.out.say("(Ctrl-C again, Ctrl-D or `quit` leaves the shell)")
                continue
            shell.running = False
            break
        except EOFError:
            break
        interrupted = False
        with shell.busy:
            shell.run_line(line)
        history.settle(understood=not shell.misread)
    keepalive.stop()
    with shell.busy:
        shell.leave()
    return 0


class Keepalive:
    """A thread that, while the shell waits at its prompt, sends a quiet request every so often:
    the server then neither closes the idle connection nor lets the session expire."""

    def __init__(self, shell: Shell, every_s: float) -> None:
        self.shell, self.every_s = shell, every_s
        self._idle, self._stopped = threading.Event(), threading.Event()
        if every_s > 0:
            threading.Thread(target=self._run, name="keepalive", daemon=True).start()

    def while_idle(self) -> _IdleSpan:
        """A context in which the shell is idle at its prompt."""
        return _IdleSpan(self._idle)

    def stop(self) -> None:
        """Send nothing more."""
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.every_s):
            if self._idle.is_set() and self.shell.busy.acquire(blocking=False):
                try:
                    self.shell.refresh_quietly()
                finally:
                    self.shell.busy.release()


@dataclass
class _IdleSpan:
    flag: threading.Event

    def __enter__(self) -> None:
        self.flag.set()

    def __exit__(self, *exc: object) -> None:
        self.flag.clear()


def _greet(shell: Shell) -> None:
    try:
        server = shell.call("ping")
        shell.out.say(f"Connected to the {server['server']} server {server['version']} at "
                      f"{shell.address}. Type `help` for the commands.")
        if server["server"] != shell.role:
            shell.out.error(f"this is the {server['server']} server, not the {shell.role} server: "
                            f"the {shell.role} shell's commands will not work here")
    except (OSError, ProtocolError) as exc:
        shell.out.error(f"cannot reach the {shell.role} server at {shell.address}: {exc}")
        shell.lost = True
    except KeyboardInterrupt:
        shell.out.error(f"cancelled: the {shell.role} server at {shell.address} did not answer yet")


def run_script(shell: Shell, lines: Iterable[str]) -> int:
    """Run lines without prompts; stop with exit status 1 at the first failure."""
    status = 0
    try:
        for line in lines:
            if not shell.running:
                break
            if not shell.run_line(line):
                status = 1
                break
    except OutputClosed:
        status = OUTPUT_CLOSED
    except KeyboardInterrupt:  # Ctrl-C while reading standard input: stop, as sh does
        status = 130
    shell.leave()
    return status


def script_lines(command: str | None) -> Iterable[str]:
    """The lines of script mode: `-c` text, else standard input."""
    if command is not None:
        return [command]
    # bytes that are not UTF-8 reach run_line as surrogates, which it refuses in one line (in a
    # UTF-8 locale standard input is strict, and iterating over it raised)
    sys.stdin.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]
    return sys.stdin
