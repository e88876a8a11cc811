"""The compiled stream reader (FileSource.read) gives exactly what the line-by-line path gives:
the same Updates with the same sources and origins, and the same file:line: reason for a bad
line, on seeded random files that mix plain lines with every kind of line it must leave alone."""

from __future__ import annotations

import random

import pytest

from csmd.connectors import files
from csmd.connectors.files import FileSource
from csmd.connectors.records import BadRecord, decode_updates
from csmd.model.formats import UpdateBlock

from helpers import ODD, PLAIN


def random_file(path, rng: random.Random, lines: int) -> None:
    out = []
    for _ in range(lines):
        pick = rng.choice(ODD) if rng.random() < 0.15 else rng.choice(PLAIN)
        ids = [rng.choice([rng.randrange(50), -rng.randrange(1, 10**18), 10**17 + rng.randrange(10**17)])
               for _ in range(2)]
        out.append(pick.format(a=ids[0], b=ids[1], l=rng.randrange(3)))
    text = "\n".join(out) + ("\n" if rng.random() < 0.5 else "")
    path.write_bytes(text.encode("utf-8", "surrogateescape"))


def outcomes(items) -> list:
    """Updates, and (line, reason) where a line is refused."""
    out = []
    for it in items:
        if isinstance(it, UpdateBlock):
            out.extend(it.updates())
            continue
        try:
            out.extend(decode_updates(it, "text"))
        except BadRecord as exc:
            out.append((it.offset, str(exc)))
    return out


def line_by_line(path) -> list:
    src = FileSource(path)
    items = []
    while recs := src.poll():
        items.extend(recs)
    return outcomes(items)


@pytest.mark.parametrize("seed", range(12))
def test_reader_gives_the_line_by_line_result(tmp_path, seed, monkeypatch):
    rng = random.Random(seed)
    path = tmp_path / "stream.txt"
    random_file(path, rng, rng.randrange(1, 400))
    monkeypatch.setattr(files, "READ_CHUNK", rng.choice([1, 7, 64, 1 << 20]))  # lines across chunk ends
    items = list(FileSource(path).read())
    assert outcomes(items) == line_by_line(path)
    assert any(isinstance(it, UpdateBlock) for it in items)


def test_reader_leaves_every_odd_line_to_the_line_parser(tmp_path):
    path = tmp_path / "odd.txt"
    path.write_bytes(("\n".join(p.format(a=5, b=6, l=1) for p in ODD) + "\n").encode("utf-8", "surrogateescape"))
    items = list(FileSource(path).read())
    assert not any(isinstance(it, UpdateBlock) for it in items)
    assert outcomes(items) == line_by_line(path)


def test_without_numba_every_line_is_a_record(tmp_path, monkeypatch):
    path = tmp_path / "stream.txt"
    random_file(path, random.Random(3), 200)
    monkeypatch.setattr(files, "scan", None)  # what the import leaves where numba cannot be imported
    items = list(FileSource(path).read())
    assert not any(isinstance(it, UpdateBlock) for it in items)
    assert outcomes(items) == line_by_line(path)
