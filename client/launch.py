"""`market buyer` and `market seller`: their options, and the shell each one opens, with the
commands of its role; interactive in a terminal, script mode otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys

from runtime.config import DEFAULT_PORTS, add_tls_arguments, env, port_setting
from wire import Connection
from wire.tls import optional_client_context

from .buyer_commands import BUYER
from .common_commands import COMMON
from .loops import run_interactive, run_script, script_lines
from .render import FORMAT_HELP, FORMATS, Output
from .seller_commands import SELLER
from .shell import Shell

PORT_SETTINGS = {"buyer": "MARKET_BUYER_PORT", "seller": "MARKET_SELLER_PORT"}
KEEPALIVE_S = 60.0  # well inside the default idle limits of sessions and connections (300 s)


def add_shell_arguments(parser: argparse.ArgumentParser, role: str) -> None:
    """The options of `market ROLE`."""
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
    return run_script(shell, script_lines(args.script))


def keepalive_seconds() -> float:
    """MARKET_KEEPALIVE_S: how often an idle shell refreshes its session (0: never)."""
    text = env("MARKET_KEEPALIVE_S", str(KEEPALIVE_S))
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if seconds < 0:
        print(f"warning: MARKET_KEEPALIVE_S={text!r} is not a number of seconds; using {KEEPALIVE_S}",
              file=sys.stderr)
        return KEEPALIVE_S
    return seconds
