"""A sampler for simple regular expressions, for ``pattern`` in generated JSON Schema strings.

It parses the pattern into a small tree (literals, classes, groups, alternation, quantifiers,
anchors) and draws one matching string from it. Constructs it cannot sample faithfully
(lookarounds, backreferences, inline flags) raise ``Unsupported`` instead of a wrong string.
"""

from __future__ import annotations

import random
import re
import string
from typing import Any

_PRINTABLE = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]
_WORD_CHARS = list(string.ascii_letters + string.digits + "_")
DOT_CHARS = list(string.ascii_letters + string.digits)


class Unsupported(Exception):
    """Internal: the pattern uses a construct the sampler does not handle."""


class Regex:
    """A sampler for simple regular expressions: literals, classes, groups, alternation,
    quantifiers and anchors. Lookarounds, backreferences and flags are refused."""

    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.pos = 0
        self.tree = self._alternation()
        if self.pos != len(self.text):
            raise Unsupported(f"an unbalanced ')' at offset {self.pos}")

    def sample(self, rng: random.Random) -> str:
        return self._emit(self.tree, rng)

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _next(self) -> str:
        char = self._peek()
        self.pos += 1
        return char

    def _alternation(self) -> tuple[Any, ...]:
        branches = [self._sequence()]
        while self._peek() == "|":
            self.pos += 1
            branches.append(self._sequence())
        return ("alt", branches)

    def _sequence(self) -> tuple[Any, ...]:
        items = []
        while self._peek() not in ("", "|", ")"):
            items.append(self._quantified())
        return ("seq", items)

    def _quantified(self) -> tuple[Any, ...]:
        atom = self._atom()
        char = self._peek()
        if char in ("*", "+", "?"):
            self.pos += 1
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        elif char == "{" and (
            match := re.match(r"\{(\d+)(,(\d*))?\}|\{,(\d+)\}", self.text[self.pos :])
        ):
            self.pos += match.end()
            if match.group(4) is not None:  # {,n}: 0 to n, as Python's re (and jsonschema) read it
                low, high = 0, int(match.group(4))
            else:
                low = int(match.group(1))
                high = (
                    low
                    if match.group(2) is None
                    else int(match.group(3))
                    if match.group(3)
                    else None
                )
        else:
            return atom
        if self._peek() in ("?", "+"):  # lazy or possessive: same strings
            self.pos += 1
        return ("rep", atom, low, high)

    def _atom(self) -> tuple[Any, ...]:
        char = self._next()
        if char == "(":
            if self.text.startswith("?:", self.pos):
                self.pos += 2
            elif match := re.match(r"\?P?<([A-Za-z_]\w*)>", self.text[self.pos :]):
                self.pos += match.end()
            elif self._peek() == "?":
                raise Unsupported("a lookaround or inline flag")
            inner = self._alternation()
            if self._next() != ")":
                raise Unsupported("an unclosed group")
            return inner
        if char == "[":
            return ("set", self._class())
        if char == ".":
            return ("set", DOT_CHARS)
        if char in ("^", "$"):
            return ("seq", [])
        if char == "\\":
            return self._escape()
        return ("set", [char])

    def _escape(self) -> tuple[Any, ...]:
        char = self._next()
        classes = _escape_class(char)
        if classes is not None:
            return ("set", classes)
        if char in ("A", "Z", "z"):
            return ("seq", [])
        if char in ("b", "B") or char in "123456789":
            raise Unsupported(f"'\\{char}'")
        return ("set", [_escape_literal(char, self)])

    def _class(self) -> list[str]:
        negate = self._peek() == "^"
        if negate:
            self.pos += 1
        chars: list[str] = []
        first = True
        while True:
            char = self._next()
            if char == "":
                raise Unsupported("an unclosed character class")
            if char == "]" and not first:
                break
            first = False
            if char == "\\":
                escaped = self._next()
                classes = _escape_class(escaped)
                if classes is not None:
                    chars.extend(classes)
                    continue
                char = _escape_literal(escaped, self)
            if self._peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                end = self._next()
                if end == "\\":
                    end = _escape_literal(self._next(), self)
                chars.extend(chr(c) for c in range(ord(char), min(ord(end), ord(char) + 4096) + 1))
            else:
                chars.append(char)
        if negate:
            excluded = set(chars)
            chars = [c for c in _PRINTABLE if c not in excluded]
        if not chars:
            raise Unsupported("an empty character class")
        return chars

    def _emit(self, node: tuple[Any, ...], rng: random.Random) -> str:
        kind = node[0]
        if kind == "set":
            return str(rng.choice(node[1]))
        if kind == "seq":
            return "".join(self._emit(item, rng) for item in node[1])
        if kind == "alt":
            return self._emit(rng.choice(node[1]), rng)
        _, atom, low, high = node
        count = rng.randint(low, low + 3 if high is None else min(high, low + 3))
        return "".join(self._emit(atom, rng) for _ in range(count))


def _escape_class(char: str) -> list[str] | None:
    digits, word, space = list(string.digits), _WORD_CHARS, [" "]
    table = {
        "d": digits,
        "w": word,
        "s": space,
        "D": [c for c in DOT_CHARS if c not in digits],
        "W": [c for c in _PRINTABLE if c not in word and c != " "],
        "S": DOT_CHARS,
    }
    return table.get(char)


def _escape_literal(char: str, regex: Regex) -> str:
    controls = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
    if char in controls:
        return controls[char]
    if char in ("x", "u"):
        width = 2 if char == "x" else 4
        digits = regex.text[regex.pos : regex.pos + width]
        if len(digits) != width or not all(c in string.hexdigits for c in digits):
            raise Unsupported(f"a malformed '\\{char}' escape")
        regex.pos += width
        return chr(int(digits, 16))
    if char == "":
        raise Unsupported("a trailing backslash")
    if char.isalpha():
        raise Unsupported(f"'\\{char}'")
    return char
