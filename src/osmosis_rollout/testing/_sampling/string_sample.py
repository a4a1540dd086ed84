"""Strings for generated JSON Schema instances: plain words, formats and pattern matches."""

from __future__ import annotations

import random
import re
import uuid

from .regex_sample import DOT_CHARS, Regex, Unsupported
from .schema_keywords import NoValue

_WORDS = ["amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "haven", "iris", "jade"]


def plain_string(rng: random.Random, low: int, high: int | None) -> str:
    start = low if high is not None and high < 3 else max(low, 3)
    stop = start + 12 if high is None else min(high, start + 12)
    size = rng.randint(start, stop)
    words: list[str] = []
    while len(" ".join(words)) < size:
        words.append(rng.choice(_WORDS))
    text = " ".join(words)
    if high is not None and len(text) > high:  # whole words read better; cut only when forced
        text = text[:high]
        text = text[:-1] + "x" if text.endswith(" ") else text
    return text


def format_string(fmt: str, rng: random.Random) -> str | None:
    n = rng.randint(1, 999)
    word = rng.choice(_WORDS)
    date = f"{rng.randint(2000, 2030):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    clock = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"
    values = {
        "date": date,
        "date-time": f"{date}T{clock}",
        "time": clock,
        "email": f"{word}.{n}@example.com",
        "idn-email": f"{word}.{n}@example.com",
        "uri": f"https://example.com/{word}/{n}",
        "iri": f"https://example.com/{word}/{n}",
        "url": f"https://example.com/{word}/{n}",
        "uri-reference": f"/{word}/{n}",
        "iri-reference": f"/{word}/{n}",
        "uri-template": f"https://example.com/{word}/{{id}}",
        "hostname": f"{word}{n}.example.com",
        "idn-hostname": f"{word}{n}.example.com",
        "ipv4": f"192.0.2.{rng.randint(1, 254)}",
        "ipv6": f"2001:db8::{rng.randint(1, 0xFFFF):x}",
        "uuid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "duration": f"P{n}D",
        "json-pointer": f"/{word}/{n}",
        "relative-json-pointer": f"1/{word}",
        "regex": f"^{word}[0-9]+$",
    }
    return values.get(fmt)


def pattern_string(pattern: str, rng: random.Random, low: int, path: str) -> str:
    try:
        compiled = re.compile(pattern)
    except re.error:
        raise NoValue(f"the pattern at {path} is not a regular expression Python accepts") from None
    try:
        text = Regex(pattern).sample(rng)
    except Unsupported as exc:
        raise NoValue(
            f"the pattern {pattern!r} at {path} uses {exc}, which the generator does not support"
        ) from None
    if len(text) < low and not pattern.endswith("$"):
        text += "".join(rng.choice(DOT_CHARS) for _ in range(low - len(text)))
    if not compiled.search(text):
        raise NoValue(f"cannot build a string matching the pattern {pattern!r} at {path}")
    return text
