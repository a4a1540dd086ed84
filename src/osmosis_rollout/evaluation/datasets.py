"""Datasets for ``osmosis test``: prompts (and ground truth) from JSONL, JSON, CSV or Parquet files.

A row is either the original Osmosis test-mode shape, ``system_prompt`` (optional) +
``user_prompt`` (+ ``ground_truth``) strings, or a ``messages`` list of OpenAI-style messages (a
JSON-encoded string in CSV). Every other column goes to ``metadata``, and ``ground_truth`` is
copied there too so reward code can read it from the rollout request.

Every problem is a :class:`~osmosis_rollout.errors.DatasetError` naming the row (1-based, as
people count records) and the column; for JSONL and CSV the file's line is named as well. Bad
rows are all reported at once (a :class:`BadRowsError`, the first :data:`MAX_LISTED` listed), so
one run shows every row to fix; ``skip_bad_rows`` runs the others instead and counts them.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..errors import DatasetError
from .dataset_rows import MESSAGE_ROLES, DatasetRow, row_from

__all__ = ["MAX_LISTED", "MESSAGE_ROLES", "BadRowsError", "Dataset", "DatasetRow", "load_dataset"]

_SUPPORTED = ".jsonl, .json, .csv or .parquet"
#: How many bad rows one error lists before "and N more".
MAX_LISTED = 20

#: A record as read from a file: (1-based row number, where it is for messages, raw value);
#: the value is a DatasetError when the record could not even be parsed.
_Raw = tuple[int, str, Any]


class BadRowsError(DatasetError):
    """Rows of a dataset are malformed: each one's problem in ``problems``, in file order.

    With one bad row the message is that row's; with several, a list of up to
    :data:`MAX_LISTED`, one a line, then how many more."""

    def __init__(self, name: str, problems: list[DatasetError], *, all_bad: bool = False) -> None:
        if len(problems) == 1 and not all_bad:
            message = str(problems[0])
        else:
            head = (
                f"every row read from {name} is bad ({len(problems)})"
                if all_bad
                else f"{len(problems)} rows of {name} are bad"
            )
            message = "\n".join([f"{head}:", *listed(problems)])
        super().__init__(message)
        self.row, self.column = problems[0].row, problems[0].column
        self.problems = problems


def listed(problems: list[DatasetError]) -> list[str]:
    """The first :data:`MAX_LISTED` problems, indented one a line, then how many more."""
    more = [f"  and {len(problems) - MAX_LISTED} more"] if len(problems) > MAX_LISTED else []
    return [f"  {problem}" for problem in problems[:MAX_LISTED]] + more


@dataclass
class Dataset:
    """What a file gave: its good rows, and the problems of the bad rows that were skipped."""

    rows: list[DatasetRow]
    skipped: list[DatasetError] = field(default_factory=list)


def load_dataset(
    path: str | os.PathLike[str],
    *,
    limit: int | None = None,
    offset: int = 0,
    skip_bad_rows: bool = False,
) -> list[DatasetRow]:
    """Read and check the rows of a dataset file, skipping ``offset`` rows, keeping ``limit``.

    JSONL and CSV files are read lazily, line by line, and only as far as needed; skipped rows
    are counted but not checked, so ``offset`` can step over a broken row. Bad rows raise one
    :class:`BadRowsError` naming them all, unless ``skip_bad_rows`` (see :func:`read_dataset`).
    """
    return read_dataset(path, limit=limit, offset=offset, skip_bad_rows=skip_bad_rows).rows


def read_dataset(
    path: str | os.PathLike[str],
    *,
    limit: int | None = None,
    offset: int = 0,
    skip_bad_rows: bool = False,
) -> Dataset:
    """:func:`load_dataset`, with the bad rows that ``skip_bad_rows`` stepped over.

    ``limit`` and ``offset`` count the file's rows, bad or good. When every row read is bad,
    skipping leaves nothing to run: that is a :class:`BadRowsError` too."""
    if limit is not None and limit < 1:
        raise DatasetError(f"limit must be at least 1, got {limit}")
    if offset < 0:
        raise DatasetError(f"offset must be 0 or more, got {offset}")
    file = Path(path)
    if not file.exists():
        raise DatasetError(f"dataset file not found: {file}")
    if file.is_dir():
        raise DatasetError(f"{file} is a directory; pass a {_SUPPORTED} file")
    suffix = file.suffix.lower()
    reader = _READERS.get(suffix)
    if reader is None:
        raise DatasetError(
            f"cannot read {file.name}: unsupported extension {suffix or '(none)'!r}; "
            f"use {_SUPPORTED}"
        )
    stop = None if limit is None else offset + limit
    records, total = reader(file, offset, stop)
    if total == 0:
        raise DatasetError(f"dataset {file} has no rows")
    if offset >= total:
        raise DatasetError(
            f"offset {offset} is beyond the end of {file.name}, which has {total} row(s)"
        )
    rows: list[DatasetRow] = []
    bad: list[DatasetError] = []
    for number, where, raw in records:
        try:
            if isinstance(raw, DatasetError):
                raise raw
            rows.append(row_from(number, raw, where))
        except DatasetError as exc:
            bad.append(exc)
    if bad and (not skip_bad_rows or not rows):
        raise BadRowsError(file.name, bad, all_bad=skip_bad_rows)
    return Dataset(rows, bad)


# -- readers: (path, start, stop) -> (selected raw records, rows seen) -----------------------


def _read_jsonl(path: Path, start: int, stop: int | None) -> tuple[list[_Raw], int]:
    selected: list[_Raw] = []
    count = 0
    with _text(path) as handle:
        for line_no, line in _lines(handle, path):
            if not line.strip():
                continue
            count += 1
            if count <= start:
                continue
            try:
                # Without its line break, so an unfinished line's column is its end, not 1.
                data = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                data = DatasetError(
                    f"invalid JSON on line {line_no} of {path.name}: {exc.msg} "
                    f"(column {exc.colno}); each line must be one whole JSON object",
                    row=count,
                )
            selected.append((count, f"line {line_no}", data))
            if stop is not None and count >= stop:
                break
    return selected, count


def _read_json(path: Path, start: int, stop: int | None) -> tuple[list[_Raw], int]:
    with _text(path) as handle:
        try:
            text = handle.read()
            if not text.strip():
                return [], 0  # an empty file has no rows, rather than invalid JSON
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                f"{path.name} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
            ) from None
        except UnicodeDecodeError:
            raise DatasetError(f"{path.name} is not UTF-8 text") from None
    rows = data
    if isinstance(data, dict):
        key = next((k for k in ("rows", "data") if k in data), None)
        rows = data.get(key) if key is not None else None
    if not isinstance(rows, list):
        raise DatasetError(
            f"{path.name} must hold a list of rows, or an object with a 'rows' or 'data' list"
        )
    chosen = rows[start:stop]
    return [(start + i + 1, "", raw) for i, raw in enumerate(chosen)], len(rows)


def _read_csv(path: Path, start: int, stop: int | None) -> tuple[list[_Raw], int]:
    selected: list[_Raw] = []
    count = 0
    with _text(path, newline="") as handle:
        reader = csv.reader(handle, strict=True)  # an unclosed quote is an error, not data
        try:
            header = next(reader, None)
            if header is None:
                return [], 0
            seen: set[str] = set()
            for name in header:
                if name and name in seen:
                    raise DatasetError(
                        f"the CSV header of {path.name} repeats this column", column=name
                    )
                seen.add(name)
            for values in reader:
                if not any(v.strip() for v in values):
                    continue
                count += 1
                if count <= start:
                    continue
                where = f"line {reader.line_num}"
                if len(values) > len(header):
                    extra = DatasetError(
                        f"has {len(values)} fields but the header has {len(header)}; "
                        f"quote values that hold a comma ({where})",
                        row=count,
                    )
                    selected.append((count, where, extra))
                else:
                    # Unnamed columns (a pandas index) are dropped; blank cells count as missing.
                    named = zip(header, values, strict=False)
                    record = {name: value for name, value in named if name and value != ""}
                    selected.append((count, where, record))
                if stop is not None and count >= stop:
                    break
        except csv.Error as exc:
            raise DatasetError(
                f"{path.name} is not valid CSV near line {reader.line_num}: {exc}"
            ) from None
        except UnicodeDecodeError:
            raise DatasetError(f"{path.name} is not UTF-8 text") from None
    return selected, count


def _read_parquet(path: Path, start: int, stop: int | None) -> tuple[list[_Raw], int]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            f"reading {path.name} needs pyarrow: pip install 'osmosis-rollout[parquet]'"
        ) from None
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"cannot read {path.name} as Parquet: {exc}") from None
    total = int(table.num_rows)
    length = None if stop is None else max(0, stop - start)
    rows = table.slice(start, length).to_pylist() if start < total else []
    return [(start + i + 1, "", raw) for i, raw in enumerate(rows)], total


_Reader = Callable[[Path, int, int | None], tuple[list[_Raw], int]]
_READERS: dict[str, _Reader] = {
    ".jsonl": _read_jsonl,
    ".ndjson": _read_jsonl,
    ".json": _read_json,
    ".csv": _read_csv,
    ".parquet": _read_parquet,
}


def _text(path: Path, *, newline: str | None = None) -> IO[str]:
    try:
        return path.open(encoding="utf-8-sig", newline=newline)
    except OSError as exc:
        raise DatasetError(f"cannot open {path}: {exc.strerror or exc}") from None


def _lines(handle: IO[str], path: Path) -> Iterator[tuple[int, str]]:
    line_no = 0
    try:
        for line_no, line in enumerate(handle, 1):
            yield line_no, line
    except UnicodeDecodeError:
        raise DatasetError(f"{path.name} is not UTF-8 text (near line {line_no + 1})") from None


# -- rows ------------------------------------------------------------------------------------
