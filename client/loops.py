"""`market buyer` and `market seller`: their options, and the two loops that feed a shell its
lines: prompt_toolkit's REPL in a terminal, with a keepalive thread while it waits at the
prompt, and script mode over `-c` or standard input.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from collections.abc import Iterable

from prompt_toolkit import PromptSession

from runtime.config import DEFAULT_PORTS, add_tls_arguments, env, port_setting
from wire import Connection, ProtocolError
from wire.tls import optional_client_context

from .buyer_commands import BUYER
from .common_commands import COMMON
from .completion import LineCompleter
from .lines import SecretFreeHistory
from .render import FORMAT_HELP, FORMATS, Output, OutputClosed
from .seller_commands import SELLER
from .shell import Shell

PORT_SETTINGS = {"buyer": "MARKET_BUYER_PORT", "seller": "MARKET_SELLER_PORT"}
KEEPALIVE_S = 60.0  # well inside the default idle limits of sessions and connections (300 s)


def add_shell_arguments(parser: argparse.ArgumentParser, role: str) -> None:
    variable = PORT_SETTINGS[role]
    parser.add_argument("--host", default=env("MARKET_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=port_setting(variable),
                        default=env(variable, str(DEFAULT_PORTS[role])))
    add_tls_arguments(parser)
    parser.add_argument("-c", "--command", dest="script", metavar="COMMANDS",
                        help="run these `;`-separated commands without prompts, then exit")
    parser.add_argument("--format", choices=FORMATS, default=None, help=FORMAT_HELP)
    if role == "buyer":
        parser.add_argument("--save-on-exit", action="store_true",
                            help="in a script, save an unsaved cart when the session ends "
                                 "(a terminal asks)")
    parser.set_defaults(func=open_shell, role=role)


def open_shell(args: argparse.Namespace) -> int:
    """`market buyer` / `market seller`: interactive in a terminal, else script mode."""
    interactive = args.script is None and sys.stdin.isatty()
    registry = COMMON | (BUYER if args.role == "buyer" else SELLER)
    try:
        tls = optional_client_context(args.tls_ca, args.tls)
    except OSError as exc:  # ssl.SSLError among them: not a PEM file
        print(f"error: cannot use the TLS CA file {args.tls_ca}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    conn = Connection(args.host, args.port, tls=tls)
    out = Output(args.format or ("table" if interactive else "tsv"))
    shell = Shell(args.role, conn, registry, out, interactive,
                  save_on_exit=getattr(args, "save_on_exit", False))
    if interactive:
        history = os.path.expanduser(env("MARKET_HISTORY_FILE", "~/.market_history"))  # .env leaves ~ as is
        return run_interactive(shell, history, keepalive_seconds())
    if args.script is None:  # a line not UTF-8 then reaches run_line, which refuses it in one line
        sys.stdin.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]
    return run_script(shell, sys.stdin if args.script is None else [args.script])


def keepalive_seconds() -> float:
    """MARKET_KEEPALIVE_S: how often an idle shell refreshes its session (0: never)."""
    text = env("MARKET_KEEPALIVE_S", str(KEEPALIVE_S))
    with contextlib.suppress(ValueError):
        if float(text) >= 0:
            return float(text)
    print(f"warning: MARKET_KEEPALIVE_S={text!r} is not a number of seconds; using {KEEPALIVE_S}",
          file=sys.stderr)
    return KEEPALIVE_S


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
