"""What the shells read in a line: UTF-8 text, commands apart at `;`, shell-like words, `#`
comments, `\\q`; and a history file that keeps no line carrying a password or a card number.
"""
from __future__ import annotations

import os
import sys

from prompt_toolkit.history import FileHistory


def utf8_text(line: str) -> str:
    """The line, if it came from UTF-8 bytes (else the bytes that were not are surrogates in it)."""
    try:
        line.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(f"it is not UTF-8 text (character {exc.start + 1})") from None
    return line


def split_commands(line: str) -> list[list[str]]:
    """The commands of a line: words as sh reads them (quotes, backslashes), `;` between
    commands, a `#` that begins a word starts a comment (`search c#` keeps it), and a
    command `\\q` keeps its backslash (also after `help`), which sh would drop."""
    commands: list[list[str]] = [[]]
    word: str | None = None  # None between words ('' is a word: "")
    quote, at = "", 0
    while at < len(line):
        char, at = line[at], at + 1
        if quote and char == quote:
            quote = ""
        elif char == "\\" and quote != "'":
            if at == len(line):
                raise ValueError("No escaped character")
            char, at = line[at], at + 1
            keep = (char not in '\\"') if quote else (
                char == "q" and word is None and commands[-1] in ([], ["help"], ["?"])
                and line[at:at + 1] in ("", *_WORD_ENDS))
            word = (word or "") + "\\" * keep + char
        elif not quote and char in _WORD_ENDS:
            if word is not None:
                commands[-1].append(word)
            word = None
            if char == ";":
                commands.append([])
        elif not quote and char == "#" and word is None:
            break
        elif not quote and char in "'\"":
            quote, word = char, word or ""
        else:
            word = (word or "") + char
    if quote:
        raise ValueError("No closing quotation")
    if word is not None:
        commands[-1].append(word)
    return [words for words in commands if words]


_WORD_ENDS = frozenset(" \t\n\r;")  # shlex's whitespace (not \f or \v), and `;`


def carries_a_secret(line: str) -> bool:
    """Whether a word of the line, as the shell reads it (quotes and backslashes undone), is a
    password or card-number flag (`-p`, `-pSECRET`, `--password=...`); an unreadable line too."""
    try:
        words = [word for command in split_commands(line) for word in command]
    except ValueError:
        return True
    return any(word.startswith(("-p", "--password", "--card-number")) for word in words)


class SecretFreeHistory(FileHistory):
    """File history without lines carrying a password or a card number, written only once the
    shell understood the line (`login bob hunter2` stays out)."""

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
