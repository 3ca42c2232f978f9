"""Commands both shells have: signup, login, logout, help, more, ping and quit. Passwords come
from the argument, a no-echo prompt or MARKET_PASSWORD, and are never kept; a login's device
token is kept (~/.market_devices) and sent with the account's next login, so that the throttles
against password guessing never slow this device down.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from runtime.config import env
from wire.errors import UnauthenticatedError

from . import fields
from .registry import Arg, RefusedError, Registry
from .render import Table

if TYPE_CHECKING:
    from .shell import Shell


class DeviceTokens:
    """Device tokens by `ROLE HOST:PORT USERNAME`, in a file only its owner reads (protocol 1.2);
    a file that cannot be read or written is no token (the login goes on without one)."""

    def __init__(self, path: str = "~/.market_devices") -> None:
        self.path = os.path.expanduser(path)

    def get(self, key: str) -> str | None:
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


COMMON = Registry()

USERNAME = Arg("username", convert=fields.username, hint="3 to 32 letters, digits, _ . -")
PASSWORD = Arg("password", "--password", "-p", secret=True, env="MARKET_PASSWORD",
               convert=fields.password("wrong password: "))
DEVICES = DeviceTokens()


@COMMON.command("signup", "Create an account and log in to it.", USERNAME,
                Arg("name", "--name", hint="your name as others see it, 1 to 32 characters"),
                replace(PASSWORD, confirm=True, convert=fields.password(), hint="8 to 128 characters"),
                aliases=("create_account",), login=False)
def signup(shell: Shell, args: dict[str, Any]) -> None:
    user = shell.call("create_account", args)
    shell.out.say(f"Account {args['username']} created (user {user['user_id']}).")
    login(shell, {"username": args["username"], "password": args["password"]})


@COMMON.command("login", "Log in.", USERNAME, PASSWORD, login=False)
def login(shell: Shell, args: dict[str, Any]) -> None:
    """login; a session already open is ended once the new one is (a failed login leaves it)."""
    device = f"{shell.role} {shell.address} {args['username']}"
    token = DEVICES.get(device)  # sent only when there is one: a 1.1 server refuses the field
    try:
        result = shell.call("login", {**args, **({"device_token": token} if token else {})})
    except UnauthenticatedError as exc:  # the session on hand, if any, stays as it was
        other = "seller" if shell.role == "buyer" else "buyer"
        given = " (the password in MARKET_PASSWORD)" if args["password"] == env("MARKET_PASSWORD") else ""
        apart = (f"{given}; buyer and seller accounts are apart: a {other} account logs in with "
                 f"`market {other}`" if "wrong username or password" in exc.message else "")
        raise RefusedError(f"{exc.message}{apart}") from None
    if result.get("device_token"):
        DEVICES.put(device, result["device_token"])
    shell.offer_to_save()  # the cart of the session that ends
    shell.end_session()
    shell.set_session(args["username"], result["token"])
    shell.out.say(f"Logged in as {args['username']} (user {result['user_id']}).")


@COMMON.command("logout", "Log out.")
def logout(shell: Shell, args: dict[str, Any]) -> None:
    name = shell.username
    shell.offer_to_save()
    try:
        shell.call("logout")
    except OSError:  # the server may not have heard it: keep the session, to log out again
        shell.out.say(f"Still logged in as {name}: the logout may not have reached the server.")
        raise
    except BaseException:  # refused (an expired session, say): nothing left to keep
        shell.set_session()
        raise
    shell.set_session()
    shell.out.say(f"Logged out {name}.")


@COMMON.command("help", "Show the commands, or how to use one.", Arg("command", required=False),
                aliases=("?",), login=False)
def help_(shell: Shell, args: dict[str, Any]) -> None:
    if args["command"] is None:
        rows = [(c.usage, c.help) for c in shell.registry.unique()]
        shell.out.table(Table("Commands", ("usage", "help"), rows, "No commands."))
        return
    command = shell.registry.get(args["command"])
    shell.out.say(f"usage: {command.usage}")
    shell.out.say(f"  {command.help}")
    for arg in command.args:
        if arg.hint:
            shell.out.say(f"  {arg.usage().strip('[]')}: {arg.hint}")
    if command.aliases:
        shell.out.say(f"  also: {', '.join(command.aliases)}")


@COMMON.command("more", "Show the next page of the last list.", login=False)
def more(shell: Shell, args: dict[str, Any]) -> None:
    if shell.more is None:
        shell.out.say("Nothing more to show.")
    else:
        shell.more()


@COMMON.command("ping", "Check that the server answers.", login=False)
def ping(shell: Shell, args: dict[str, Any]) -> None:
    result = shell.call("ping")
    shell.out.say(f"The {result['server']} server {result['version']} at {shell.address} answers.")


@COMMON.command("quit", "Leave the shell (logging out).", aliases=("exit", "\\q"), login=False)
def quit_(shell: Shell, args: dict[str, Any]) -> None:
    """Stop the loop; the shell logs out as it closes."""
    shell.running = False
