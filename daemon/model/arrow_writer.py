"""Arrow IPC output of matches and deltas, written batch by batch (never all in memory)."""

from __future__ import annotations

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


class MatchFile:
    """`csmd match --output`: every match of every query, as Arrow IPC file batches."""

    def __init__(self, path, ext_ids):
        self.ext_ids, self.id_type = ext_ids, id_type_of(ext_ids)
        self.schema = matches_schema(self.id_type)
        self._writer = ipc.new_file(str(path), self.schema)

    def write(self, query: str, first_index: int, rows: np.ndarray) -> None:
        k = len(rows)
        self._writer.write_batch(pa.record_batch([
            pa.array([query] * k, pa.string()),
            pa.array(np.arange(first_index, first_index + k, dtype=np.int64)),
            vertex_lists(self.ext_ids, rows, self.id_type),
        ], schema=self.schema))

    def close(self) -> None:
        self._writer.close()
