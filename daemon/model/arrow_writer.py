"""Arrow IPC output of matches and deltas, written batch by batch (never all in memory)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from csmd.schemas import id_type_of, matches_schema


def vertex_lists(ext_ids: np.ndarray, rows: np.ndarray, id_type: pa.DataType) -> pa.Array:
    """rows (k x n internal ids) -> a list array of the k matches as external ids."""
    k, n = rows.shape
    values = pa.array(ext_ids[rows.reshape(-1)], type=id_type)
    offsets = pa.array(np.arange(0, k * n + 1, n, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, values, type=pa.list_(id_type))


STDOUT = Path("-")  # --output -: the Arrow IPC stream on standard output


def seekable_file(path) -> bool:
    """Whether `path` can hold the IPC file format (a regular file, or one not there yet): its
    footer points back into the file, which a pipe, a terminal or /dev/null cannot keep."""
    if Path(path) == STDOUT:
        return False
    try:
        return stat.S_ISREG(Path(path).stat().st_mode)
    except FileNotFoundError:
        return True


def arrow_writer(path, schema: pa.Schema) -> ipc.RecordBatchWriter:
    """An Arrow IPC writer for --output: the file format (random access) where `path` is a file,
    else the stream format, what the output topic's records hold: `-` writes to standard output,
    and a pipe or device gets a stream instead of a footer it cannot hold."""
    if seekable_file(path):
        return ipc.new_file(str(path), schema)
    # a Python file object: Arrow's own asks the pipe for its position (lseek), which fails; the
    # writer never closes it, which leaves standard output open and a pipe's end to the process's exit
    return ipc.new_stream(sys.stdout.buffer if Path(path) == STDOUT else open(path, "wb"), schema)


class MatchFile:
    """`csmd match --output`: every match of every query, as Arrow IPC file batches."""

    def __init__(self, path, ext_ids):
        self.ext_ids, self.id_type = ext_ids, id_type_of(ext_ids)
        self.schema = matches_schema(self.id_type)
        self._writer = arrow_writer(path, self.schema)

    def write(self, query: str, first_index: int, rows: np.ndarray) -> None:
        k = len(rows)
        self._writer.write_batch(pa.record_batch([
            pa.array([query] * k, pa.string()),
            pa.array(np.arange(first_index, first_index + k, dtype=np.int64)),
            vertex_lists(self.ext_ids, rows, self.id_type),
        ], schema=self.schema))

    def close(self) -> None:
        self._writer.close()
