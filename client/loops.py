"""The two loops that feed a shell its lines: prompt_toolkit's REPL in a terminal, with a
keepalive thread while it waits at the prompt, and script mode over `-c` or standard input.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterable, Iterator

from prompt_toolkit import PromptSession

from wire import ProtocolError

from .completion import LineCompleter
from .lines import SecretFreeHistory
from .render import OutputClosed
from .shell import Shell

# The exit status when the reader of the output went away (`| head -1`): a command killed by
# SIGPIPE has 141 in sh; the commands after the one cut short have not run.
OUTPUT_CLOSED = 141


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

    @contextlib.contextmanager
    def while_idle(self) -> Iterator[None]:
        """A context in which the shell is idle at its prompt."""
        self._idle.set()
        try:
            yield
        finally:
            self._idle.clear()

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
