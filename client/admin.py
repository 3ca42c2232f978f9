"""`market admin`: the operator's commands, run against the database itself (no server needed).
Each action in ACTIONS is one small function over operate.admin (imported only when one runs);
what it changed is printed in one line and written to the audit table `market admin log` shows.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from observe import logs
from runtime.config import env, positive_int
from wire import ProtocolError
from wire.values import format_time

from .render import FORMATS, Output, Table


@dataclass(frozen=True)
class Action:
    """A subcommand: its help, its arguments (user or item) and what it runs."""

    help: str
    target: str  # "user", "item" or "" (none)
    run: Callable[[Any, argparse.Namespace, Output], None]
    changes: bool = True  # written to the log, with --reason
    flags: tuple[tuple[str, str], ...] = ()  # (--flag, help) options, passed as booleans


def _work(work: str, *target: str, show: str = "") -> Callable[[Any, argparse.Namespace, Output], None]:
    """An action running operate.admin's `work`: with `show`, a look at one user or item; else a
    change in one transaction, its outcome said and logged (market.business) besides the table."""
    def run(database: Any, args: argparse.Namespace, out: Output) -> None:
        from operate import admin

        values, function = [getattr(args, name) for name in target], getattr(admin, work)
        if show:
            shown = database.run(lambda tx: function(tx, *values), write=False)
            rows = [(label, "-" if value is None else str(value)) for label, value in shown.items()]
            out.table(Table(show, ("field", "value"), rows, f"no {show}"))
            return
        outcome = database.run(lambda tx: function(tx, admin.Operator.here(args.reason), *values))
        logs.business.info("admin %s: %s", work, outcome, extra={
            "action": work, "target": " ".join(map(str, values)), "reason": args.reason})
        out.say(outcome)
    return run


def _purge(database: Any, args: argparse.Namespace, out: Output) -> None:
    from operate.admin import Operator
    from operate.purge import LOAD_TEST_PREFIX, preview, purge

    if not args.yes:
        out.say(f"would remove {preview(database).sentence()} (accounts named {LOAD_TEST_PREFIX}...); "
                "run again with --yes to do it")
        return
    out.say(f"removed {purge(database, Operator.here(args.reason)).sentence()}")


def _log(database: Any, args: argparse.Namespace, out: Output) -> None:
    from operate.admin import action_log

    rows = database.run(lambda tx: action_log(tx, args.limit), write=False)
    columns = ("when", "who", "action", "target", "outcome", "reason")
    out.table(Table("operator's actions, newest first", columns,
                    [(format_time(r.at_ms / 1000), f"{r.os_user}@{r.host}", r.action, r.target, r.outcome,
                      r.reason or "-") for r in rows],
                    "no operator's action has been recorded"))


ACTIONS = {
    "suspend": Action("suspend an account: its sessions end, its logins are refused", "user",
                      _work("suspend", "role", "username", "off_sale"),
                      flags=(("--off-sale", "a seller's items leave sale too (for good: reinstating "
                                            "does not relist them)"),)),
    "reinstate": Action("lift an account's suspension", "user", _work("reinstate", "role", "username")),
    "end-sessions": Action("end every session of an account (its carts go; the saved cart stays)", "user",
                           _work("end_user_sessions", "role", "username")),
    "clear-throttle": Action("forget the failed logins counted for a username", "user",
                             _work("clear_throttle", "role", "username")),
    "take-off-sale": Action("take every unit of an item off sale", "item",
                            _work("take_off_sale", "item_id")),
    "show-user": Action("show an account with its state and counters", "user",
                        _work("show_user", "role", "username", show="user"), changes=False),
    "show-item": Action("show an item with its counters", "item",
                        _work("show_item", "item_id", show="item"), changes=False),
    "purge-test-data": Action("remove the load tools' accounts (loadtest-...) and what they wrote", "",
                              _purge, flags=(("--yes", "remove them (without it: only say what would go)"),)),
    "log": Action("show the operator's actions, newest first", "", _log, changes=False),
}


def add_admin_parser(sub: Any, db: argparse.ArgumentParser) -> None:
    """`market admin ...` on the `market` parser's subcommands; `db` gives --db-url."""
    parser = sub.add_parser("admin", parents=[db], help="the operator's commands (suspend, take off "
                            "sale, show, log)", description="The operator's commands, run against the "
                                                            "marketplace's database.")
    parser.add_argument("--format", choices=FORMATS, default="table" if sys.stdout.isatty() else "tsv")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, action in ACTIONS.items():
        p = actions.add_parser(name, help=action.help, description=action.help.capitalize() + ".")
        if action.target == "user":
            p.add_argument("role", choices=("buyer", "seller"))
            p.add_argument("username")
        elif action.target == "item":
            p.add_argument("item_id", type=positive_int)
        if action.changes:
            p.add_argument("--reason", help="why, for the log")
        for flag, help in action.flags:
            p.add_argument(flag, action="store_true", help=help)
        if name == "log":
            p.add_argument("--limit", type=positive_int, default=50)
        p.set_defaults(func=run_admin, admin_action=action)


def run_admin(args: argparse.Namespace) -> int:
    """Run one `market admin` action; 0 done, 1 refused (a bad name or id), 2 database unusable."""
    if not logging.getLogger().handlers:  # a process of its own (not a host that logs already)
        logs.configure_leniently("admin", str(env("MARKET_LOG_LEVEL", "INFO")),
                                 str(env("MARKET_LOG_FORMAT", "text")))
        logging.getLogger("alembic").setLevel(logging.WARNING)  # its schema check says each step
    out = Output(args.format, say_to_stdout=True)

    def act(database: Any) -> tuple[str, int]:
        check_schema(database)
        args.admin_action.run(database, args, out)
        return "", 0
    return on_database(args.db_url, act, who="market admin", must_exist=(args.db_url,))


def check_schema(database: Any) -> None:
    """DatabaseUnusable, saying what to run, if this database cannot take the operator's commands."""
    from db import DatabaseUnusable
    from db.migrations import revision_of

    revision = revision_of(database)
    if revision.current is None:
        raise DatabaseUnusable("not a marketplace database (no schema revision); "
                               "run `market db upgrade` on it first")
    if not revision.is_head:
        raise DatabaseUnusable(f"the database is at revision {revision.current}, this code's is "
                               f"{revision.head}: run `market db upgrade --db-url URL` first")


def on_database(db_url: str, report: Callable[[Any], tuple[str, int]], who: str = "error",
                pool_size: int = 1, must_exist: tuple[str | None, ...] = ()) -> int:
    """Print report(database)'s lines and return its status; one line `who: ...` and status 1
    on an action refused, 2 on a database it cannot use or on a SQLite file of `must_exist`
    that is not there."""
    from sqlalchemy.exc import DBAPIError

    from db import Database, DatabaseUnusable

    missing = next((url for url in must_exist if url and missing_sqlite_file(url)), None)
    if missing:
        print(f"{who}: no such database file: {missing}", file=sys.stderr)
        return 2
    database = Database(db_url, pool_size=pool_size)
    try:
        text, status = report(database)
        if text:
            print(text)
        return status
    except ProtocolError as exc:
        print(f"{who}: {exc}", file=sys.stderr)
        return 1
    except DBAPIError as exc:
        print(f"{who}: cannot use the database: {' '.join(str(exc.orig).split())}", file=sys.stderr)
        return 2
    except DatabaseUnusable as exc:
        print(f"{who}: {exc}", file=sys.stderr)
        return 2
    finally:
        database.close()


def missing_sqlite_file(db_url: str) -> bool:
    """True for a SQLite URL whose file does not exist (opening it would create it, empty)."""
    from sqlalchemy import make_url

    url = make_url(db_url)
    return url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
        and not os.path.exists(url.database)
