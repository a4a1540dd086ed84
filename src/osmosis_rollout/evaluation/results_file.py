"""The ``--output`` results file: one JSON object per rollout in dataset order (a row's samples
in sample order), then, with ``--samples``, one per group, then a summary (JSON Lines); or, for
a ``.json`` path, the original SDK's one JSON object (``{"summary": ..., "results": [...]}``,
see :mod:`.legacy_results`) written when the run ends."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from ..errors import ConfigError
from ..redaction import scrub_data


def open_output(path: Path) -> IO[str]:
    """The results file, opened for writing (its folder made); a ConfigError if it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("w", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write --output {path}: {exc.strerror or exc}") from None


class OrderedRows:
    """Writes ``--output`` rows in dataset order as soon as each one's predecessors are done,
    with trace paths relative to the results file so the pair can be moved together."""

    def __init__(
        self,
        sink: IO[str] | None,
        order: list[tuple[int, int]],
        output: Path | None,
        *,
        secrets: Iterable[str] = (),
    ) -> None:
        self.sink = sink
        #: Keys scrubbed from every row (every form: JSON, URL, HTML, base64...).
        self.secrets = [s for s in secrets if s]
        self.order = order
        self.next = 0
        self.waiting: dict[tuple[int, int], Any] = {}  # by (row, sample)
        self.base = output.resolve().parent if output is not None else None
        #: A ``.json`` file holds one object: its rows wait for the summary (the legacy shape).
        self.whole: list[dict[str, Any]] | None = (
            [] if output is not None and output.suffix.lower() == ".json" else None
        )

    def add(self, result: Any) -> None:
        """Hold ``result`` until every earlier row is written, then write what is ready."""
        if self.sink is None:
            return
        self.waiting[(result.index, result.sample)] = result
        while self.next < len(self.order) and self.order[self.next] in self.waiting:
            self._write(self.waiting.pop(self.order[self.next]))
            self.next += 1
        self.sink.flush()

    def flush_all(self) -> None:
        """On an interrupt: write the rows still held back, in order, gaps and all."""
        for index in sorted(self.waiting):
            self._write(self.waiting.pop(index))

    def finish(self, summary: dict[str, Any]) -> None:
        """End the file with the run's summary (a line, or the one object of a ``.json``)."""
        if self.sink is None:
            return
        if self.whole is None:
            self.sink.write(json.dumps(summary) + "\n")
            return
        from .legacy_results import legacy_results

        json.dump(legacy_results(summary, self.whole), self.sink, indent=2, default=str)
        self.sink.write("\n")

    def _write(self, result: Any) -> None:
        assert self.sink is not None
        row = result.as_dict()
        for secret in self.secrets:
            row = scrub_data(row, secret)
        if row.get("trace") and self.base is not None:
            row["trace"] = os.path.relpath(row["trace"], self.base)
        if self.whole is not None:
            self.whole.append(row)
            return
        self.sink.write(json.dumps(row, default=str) + "\n")
