"""The two loops that feed a shell its lines: prompt_toolkit's REPL in a terminal, with a
keepalive thread while it waits at the prompt, and script mode over `-c` or standard input.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Iterable

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
    idle, stopped = threading.Event(), threading.Event()
    if keepalive_s > 0:
        threading.Thread(target=_keep_alive, args=(shell, keepalive_s, idle, stopped), name="keepalive",
                         daemon=True).start()
    interrupted = False
    while shell.running:
        idle.set()
        try:
            line = session.prompt(f"{shell.username + '@' if shell.username else ''}{shell.role}> ")
        except KeyboardInterrupt:
            if session.default_buffer.text or not interrupted:
                interrupted = not session.default_buffer.text
                if interrupted:
                    shell.out.say("(Ctrl-C again, Ctrl-D or `quit` leaves the shell)")
                continue
            break
        except EOFError:
            break
        finally:
            idle.clear()
        interrupted = False
        with shell.busy:
            shell.run_line(line)
        history.settle(understood=not shell.misread)
    stopped.set()
    with shell.busy:
        shell.leave()
    return 0


def _keep_alive(shell: Shell, every_s: float, idle: threading.Event, stopped: threading.Event) -> None:
    """While the shell waits at its prompt, a quiet request every so often: the server then
    neither closes the idle connection nor lets the session expire."""
    while not stopped.wait(every_s):
        if idle.is_set() and shell.busy.acquire(blocking=False):
            try:
                shell.refresh_quietly()
            finally:
                shell.busy.release()


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
