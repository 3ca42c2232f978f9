"""What the shells read in a line: UTF-8 text, commands apart at `;`, shell-like words, `#`
comments, `\\q`; and a history file that keeps no line carrying a password or a card number.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterator

from prompt_toolkit.history import FileHistory


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
