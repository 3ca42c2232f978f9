"""Tab completion of a shell line: command names, then the command's options, the values an
option or word accepts (categories by name, new/used, up/down) and the item ids of the last list.
"""
from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Iterator

from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document

from .registry import Arg, Command, Registry


class LineCompleter(Completer):
    """Completes the word under the cursor from the registry and the ids seen last."""

    def __init__(self, registry: Registry, seen_ids: Callable[[], list[str]]) -> None:
        self.registry, self.seen_ids = registry, seen_ids

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        before = document.text_before_cursor.rsplit(";", 1)[-1]
        words = _words(before)
        current = "" if not words or before[-1:].isspace() else words.pop()
        if not words:
            yield from _matching(sorted(self.registry.commands), current)
            return
        command = self.registry.commands.get(words[0])
        if command is not None:
            yield from _matching(self._candidates(command, words[1:], current), current)

    def _candidates(self, command: Command, words: list[str], current: str) -> Iterable[str]:
        if current.startswith("-"):
            return [flag for arg in command.args for flag in (arg.flag, arg.alias) if flag]
        option = _option_of(command, words[-1]) if words else None
        if option is not None:
            return self._values(option)
        positional = [arg for arg in command.args if not arg.flag]
        index = sum(1 for at, word in enumerate(words)  # the words not options nor their values
                    if not word.startswith("-") and not (at > 0 and _option_of(command, words[at - 1])))
        arg = positional[min(index, len(positional) - 1)] if positional else None
        return self._values(arg) if arg is not None and (index < len(positional) or arg.many) else []

    def _values(self, arg: Arg) -> Iterable[str]:
        return self.seen_ids() if arg.name == "item_id" else arg.choices


def _option_of(command: Command, word: str) -> Arg | None:
    return next((arg for arg in command.args if arg.flag and word in (arg.flag, arg.alias)), None)


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an open quote: the words so far, roughly
        return text.split()


def _matching(candidates: Iterable[str], current: str) -> Iterator[Completion]:
    for candidate in candidates:  # a word completed is followed by a space, ready for the next
        if candidate.lower().startswith(current.lower()):
            yield Completion(candidate + " ", start_position=-len(current), display=candidate)
