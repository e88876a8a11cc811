"""File source and sink: the connectors `csmd replay` runs the pipeline with.

They share the Kafka connectors' interface (records in, delta batches out), so
replay exercises the daemon's decoding and delta encoding on files.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from csmd.model.arrow_writer import arrow_writer, seekable_file
from csmd.model.formats import UpdateBlock

from .records import Record

try:
    from .textscan import scan
except ImportError:  # no numba: every line goes through poll's Records
    scan = None

READ_CHUNK = 1 << 20  # bytes that read() scans at a time
WRITE_CHUNK = 1 << 18  # bytes FileSink hands the kernel at a time (see ChunkedFile)


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


class ChunkedFile:
    """A regular file that pyarrow's IPC writer writes through, WRITE_CHUNK bytes a system call:
    Arrow writes each buffer of a record batch in one call (tens of MB for a batch of materialised
    deltas), and on the development VM such writes ran at about 1 GB/s once the process had churned
    its memory, against some 4 GB/s in 256 KB pieces (same bytes; os.write releases the GIL)."""

    closed = False

    def __init__(self, path):
        # a file already there is removed, not truncated: ext4 (auto_da_alloc) writes a truncated
        # file's new blocks back to disk when it is closed, 0.24-0.33 s for 1 GB on the development
        # VM, in a replay's time, against a 0.06-0.19 s unlink here, before it (a symlink is kept:
        # written through, truncated; so is a file whose folder we may not change)
        if not os.path.islink(path) and os.path.isfile(path):
            with contextlib.suppress(PermissionError):
                os.unlink(path)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self._pos = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        for lo in range(0, len(view), WRITE_CHUNK):
            piece = view[lo: lo + WRITE_CHUNK]
            while len(piece):  # a regular file takes all of it unless the disk is full, which raises
                piece = piece[os.write(self._fd, piece):]
        self._pos += len(view)
        return len(view)

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self._fd)


class FileSink:
    """Deltas to an Arrow IPC file (or stream: arrow_writer): each pipeline batch's deltas by update
    (then query, match), encoded on a thread of its own and written on another while the pipeline
    goes on with the next batches (the encoder's compiled fills and the writes release the GIL: on
    the yeast stream with 2 threads replay --output took a fifth less with one thread for both)."""

    def __init__(self, path, schema: pa.Schema):
        # a file format's file through ChunkedFile; a pipe or standard output as arrow_writer opens it
        self._file = ChunkedFile(path) if seekable_file(path) else None
        self._writer = arrow_writer(path, schema) if self._file is None else ipc.new_file(self._file, schema)
        # one batch's items waiting at most (a second write waits), and one encoded piece: a batch's
        # deltas, the piece being encoded, one waiting and the one being written are what the sink holds
        self._jobs: queue.Queue = queue.Queue(1)
        self._pieces: queue.Queue = queue.Queue(1)
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=self._encode, name="csmd-file-encode", daemon=True),
                         threading.Thread(target=self._write, name="csmd-file-sink", daemon=True)]
        for t in self._threads:
            t.start()

    def write(self, items, on_ack=None, on_send=None) -> None:
        """items: (query, record batch, origins) from DeltaEncoder.encode(by_update=True), in the
        file's order, taken on the sink's encoding thread after the items before and written in
        turn on its writing thread; a piece is built while the one before is written, so a batch's
        deltas are never all in memory as Arrow; on_send and on_ack (on the writing thread) once it
        is written. Raises what a write before failed with."""
        self._raise()
        self._jobs.put((items, on_ack, on_send))

    def _encode(self) -> None:
        while (job := self._jobs.get()) is not None:
            items, on_ack, on_send = job
            try:
                for _, batch, origins in items if self._error is None else ():
                    self._pieces.put((batch, origins, on_ack, on_send))
                    if self._error is not None:  # after a failure, what is queued is dropped: close raises it
                        break
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                self._error = exc
        self._pieces.put(None)

    def _write(self) -> None:
        while (piece := self._pieces.get()) is not None:
            if self._error is None:
                batch, origins, on_ack, on_send = piece
                try:
                    self._writer.write_batch(batch)
                    if on_send is not None:
                        on_send(origins)
                    if on_ack is not None:
                        on_ack(origins)
                except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                    self._error = exc

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Once every write is written: the file's footer, then the file closed."""
        self._jobs.put(None)
        for t in self._threads:
            t.join()
        try:
            self._writer.close()
        finally:
            if self._file is not None:
                self._file.close()
        self._raise()
