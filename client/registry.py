"""The command registry of the shells: each command's name, arguments, one-line help and handler,
registered with a decorator; `help`, tab completion and argument parsing all come from it.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from runtime.config import env

Handler = Callable[[Any, dict[str, Any]], object]  # what it returns is not used
Ask = Callable[["Arg", str], str]  # (argument, why it is asked again or "") -> the answer


class UsageError(Exception):
    """A command line that does not fit its command; the shell prints it with the usage."""


class BadValueError(UsageError):
    """A value that is not valid for its argument; the message says what would do."""


class RefusedError(Exception):
    """A command that cannot be done as things stand (buying an empty cart); says what to do."""


@dataclass(frozen=True)
class Arg:
    """A positional word (no flag) or an option (`--flag VALUE`)."""

    name: str
    flag: str | None = None
    alias: str | None = None
    convert: Callable[[str], Any] = str
    required: bool = True
    secret: bool = False  # read without echo
    confirm: bool = False  # asked twice
    many: bool = False  # takes the remaining words
    default: Any = None
    env: str | None = None  # the variable that gives it in script mode
    hint: str = ""  # the values accepted, for `help COMMAND`
    choices: tuple[str, ...] = ()  # words offered by completion
    asked: bool = False  # optional, yet asked for (Enter: none) when the command asks for others

    @property
    def label(self) -> str:
        """How the argument appears in usage lines and prompts."""
        return self.name.replace("_", " ")

    def usage(self) -> str:
        """This argument's part of the usage line."""
        word = self.name.upper() + ("..." if self.many else "")
        text = f"{self.flag} {self.name.upper()}" if self.flag else word
        return text if self.required and not self.secret else f"[{text}]"  # secrets are asked


@dataclass(frozen=True)
class Command:
    """One command of a shell."""

    name: str
    help: str
    handler: Handler
    args: tuple[Arg, ...] = ()
    aliases: tuple[str, ...] = ()
    login: bool = True
    check: Callable[[Any], None] | None = None  # run before any value is asked for

    @property
    def usage(self) -> str:
        return " ".join([self.name, *(arg.usage() for arg in self.args)])

    def parse(self, words: list[str]) -> dict[str, Any]:
        """The raw values of the words, options and positional words intermixed (after `--`, all
        positional); UsageError if they do not fit."""
        raw: dict[str, Any] = {arg.name: None for arg in self.args}
        options = {flag: arg for arg in self.args for flag in (arg.flag, arg.alias) if flag}
        left, loose = list(words), list[tuple[bool, str]]()  # (an option?, word): not taken yet
        while left:
            word = left.pop(0)
            flag, equals, value = word.partition("=")
            if not (equals and flag in options):  # else `-pSECRET`
                flag, value = word[:2], word[2:]
            if word == "--":
                loose += [(False, word) for word in left]
                break
            if word in options:
                if not left or _is_option(left[0]):
                    arg = options[word]
                    raise UsageError(f"argument {'/'.join(filter(None, (arg.flag, arg.alias)))}: "
                                     "expected one argument")
                raw[options[word].name] = left.pop(0)
            elif flag in options:
                raw[options[flag].name] = value
            else:
                loose.append((_is_option(word), word))
        positional, extra = [arg for arg in self.args if not arg.flag], []
        for option, word in loose:
            if option or not positional:
                extra.append(word)
            elif positional[0].many:
                raw[positional[0].name] = [*(raw[positional[0].name] or []), word]
            else:
                raw[positional.pop(0).name] = word
        if extra and any(arg.secret for arg in self.args):  # a stray word may be the secret typed in the open
            raise UsageError(f"{len(extra)} unexpected word(s)")
        if extra:
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
        return raw

    def values(self, words: list[str], ask: Ask | None) -> dict[str, Any]:
        """Converted values; a missing required one, or one not valid, is asked for (again),
        or without `ask` an error; `asked` optional ones only along with a required one."""
        raw = self.parse(words)
        asking = ask is not None and any(arg.required and not raw[arg.name] for arg in self.args)
        return {arg.name: _value(arg, raw[arg.name], ask, asking) for arg in self.args}


def _value(arg: Arg, raw: Any, ask: Ask | None, asking: bool) -> Any:
    where = ""
    if not raw and arg.env and ask is None and env(arg.env):
        raw, where = env(arg.env), f" (from {arg.env})"
    if not raw and not arg.required and not (arg.asked and asking):
        return arg.default
    problem = ""
    while True:
        if not raw and ask is not None:
            raw = ask(arg, problem)
            if not raw and not arg.required:
                return arg.default
        if not raw:
            raise UsageError(f"missing {arg.label}")
        try:
            return arg.convert(raw)
        except ValueError as exc:
            if ask is None:
                raise BadValueError(f"{arg.label}{where}: {exc}") from None
            raw, problem = None, str(exc)


def _is_option(word: str) -> bool:
    """Whether a word reads as an option, as argparse reads it (not `-`, `-3` or `-1.5`)."""
    return word.startswith("-") and len(word) > 1 and " " not in word \
        and not re.fullmatch(r"-\d+|-\d*\.\d+", word)


@dataclass
class Registry:
    """Commands by name (aliases included), in the order they were registered."""

    commands: dict[str, Command] = field(default_factory=dict)

    def command(self, name: str, help: str, *args: Arg, aliases: Iterable[str] = (),
                login: bool = True, check: Callable[[Any], None] | None = None,
                ) -> Callable[[Handler], Handler]:
        """Decorator: register a handler as a command."""
        def register(handler: Handler) -> Handler:
            self.add(Command(name, help, handler, args, tuple(aliases), login, check))
            return handler
        return register

    def add(self, *commands: Command) -> None:
        for command in commands:
            for key in (command.name, *command.aliases):
                self.commands[key] = command

    def __or__(self, other: Registry) -> Registry:
        return Registry({**self.commands, **other.commands})

    def get(self, name: str) -> Command:
        """The command of a name or alias; UsageError if there is none."""
        command = self.commands.get(name)
        if command is None:
            raise UsageError(f"unknown command {name!r}; type `help` for the list")
        return command

    def unique(self) -> list[Command]:
        """Each command once, in registration order."""
        return list({id(c): c for c in self.commands.values()}.values())


def saying(op: str, said: Callable[[dict[str, Any], dict[str, Any]], str]) -> Handler:
    """A command's handler that sends `op` with the command's values and says one line made
    of them and the answer."""
    def handler(shell: Any, args: dict[str, Any]) -> None:
        shell.out.say(said(args, shell.call(op, args)))
    return handler


def word_list(text: str | list[str]) -> list[str]:
    """Words given apart or joined by commas: `desk,light` or `desk light`; a word given again,
    in any case, is dropped (the server compares keywords ignoring case and refuses repeats)."""
    words = (",".join(text) if isinstance(text, list) else text).replace(" ", ",").split(",")
    kept: dict[str, str] = {}
    for word in filter(None, words):
        kept.setdefault(word.lower(), word)
    return list(kept.values())


def one_of(*options: str) -> Callable[[str], str]:
    """A converter accepting one of a few words."""
    def convert(text: str) -> str:
        if text.lower() not in options:
            raise ValueError(f"must be {' or '.join(options)}, not {text!r}")
        return text.lower()
    return convert
