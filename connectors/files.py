"""File source and sink: the connectors `csmd replay` runs the pipeline with.

They share the Kafka connectors' interface (records in, delta batches out), so
replay exercises the daemon's decoding and delta encoding on files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from csmd.model.arrow_writer import arrow_writer
from csmd.model.formats import UpdateBlock

from .records import Record

try:
    from .textscan import scan
except ImportError:  # no numba: every line goes through poll's Records
    scan = None

READ_CHUNK = 1 << 20  # bytes that read() scans at a time


class FileSource:
    """The update stream of a text file, one record per line (offset = line number)."""

    def __init__(self, path):
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")
        except OSError as exc:
            from csmd.errors import InputError

            raise InputError(self.path, None, exc.strerror or str(exc)) from None
        self._lineno = 0

    def poll(self, max_records: int = 1024, timeout: float = 0.0) -> list[Record]:
        """The next records (blank and comment lines skipped); [] at the end of the file."""
        out: list[Record] = []
        name = str(self.path)
        while len(out) < max_records:
            line = self._file.readline()
            if not line:
                break
            self._lineno += 1
            body = line.strip()
            if body and not body.startswith(b"#"):
                out.append(Record(name, 0, self._lineno, body, where=f"{name}:{self._lineno}"))
        return out

    def read(self, blocks: bool = True):
        """The rest of the file, for a caller that takes it all at once (csmd replay): runs of
        plain update lines as UpdateBlocks, read by compiled code (textscan.py), and every other
        line as the Record that poll makes of it (decode_updates decides it). Without numba, or
        without `blocks` (their ids are integers), only Records."""
        if scan is None or not blocks:
            while recs := self.poll():
                yield from recs
            return
        name, buf, eof = str(self.path), b"", False
        while buf or not eof:
            if not eof:
                more = self._file.read(READ_CHUNK)
                eof, buf = not more, buf + more
            cut = len(buf) if eof else buf.rfind(b"\n") + 1  # whole lines only
            pos = 0
            while pos < cut:
                rows, pos, next_line, *cols = scan(np.frombuffer(buf, np.uint8, cut), pos, self._lineno + 1)
                self._lineno = next_line - 1
                if rows:
                    yield UpdateBlock(name, *cols)
                if pos < cut:  # a line that is not plain
                    end = buf.find(b"\n", pos, cut)
                    end = cut if end < 0 else end
                    self._lineno += 1
                    yield Record(name, 0, self._lineno, buf[pos:end].strip(), where=f"{name}:{self._lineno}")
                    pos = end + 1
            buf = buf[cut:]

    def close(self) -> None:
        self._file.close()


class FileSink:
    """Deltas to an Arrow IPC file (or stream: arrow_writer): each pipeline batch's deltas by update (then query, match)."""

    def __init__(self, path, schema: pa.Schema):
        self._writer = arrow_writer(path, schema)

    def write(self, items, on_ack=None, on_send=None) -> int:
        """items: (query, record batch, origins) from DeltaEncoder.encode(by_update=True), in the
        file's order; each written before the next is taken (the encoder builds it then), so a
        batch's deltas are never all in memory as Arrow; acknowledged at once."""
        n = 0
        for _, batch, origins in items:
            self._writer.write_batch(batch)
            n += 1
            if on_send is not None:
                on_send(origins)
            if on_ack is not None:
                on_ack(origins)
        return n

    def close(self) -> None:
        self._writer.close()
