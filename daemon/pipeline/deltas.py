"""Match deltas as Arrow record batches with deterministic ids (the replay file and the output topic).

A delta's id is (input, partition, offset, query, index): the input record that
caused it and its number among that record's deltas for the query. Deltas leave
the executor in a fixed order (by update, then by match), so the same delta gets
the same id in every run, whatever the batching, and a consumer can drop the
duplicates that a restart after a crash re-sends.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from csmd.schemas import deltas_schema, id_type_of

from csmd.model.arrow_writer import vertex_lists


class DeltaEncoder:
    """Turns each batch's deltas into one record batch per query, in update order."""

    def __init__(self, vertices):
        self.vertices = vertices  # the sequencer's vertex table
        self._ext = np.array(vertices.ext_ids)
        self.id_type = id_type_of(self._ext)
        self.schema = deltas_schema(self.id_type)
        # per query: the origin of its last delta and the next index for that origin; an
        # input record's updates may span two batches, so its numbering carries over
        self._last: dict[str, tuple[tuple, int]] = {}

    def ext_ids(self) -> np.ndarray:
        ext_ids = self.vertices.ext_ids
        if len(ext_ids) > len(self._ext):  # vertices created by the stream
            self._ext = np.concatenate([self._ext, np.array(ext_ids[len(self._ext):], self._ext.dtype)])
        return self._ext

    def encode(self, result) -> list[tuple[str, pa.RecordBatch, list[tuple]]]:
        """(query, record batch, origins in it) for every query with deltas in this batch."""
        out = []
        record_of = result.batch.record_of
        for d in result.deltas:
            k = len(d.seq)
            if not k:
                continue
            recs = [record_of[s] for s in d.seq.tolist()]
            origins = [r.origin for r in recs]
            # index: position within each run of equal origins, continuing the previous batch's run
            starts = np.flatnonzero([i == 0 or origins[i] != origins[i - 1] for i in range(k)])
            index = np.arange(k, dtype=np.int64) - np.repeat(starts, np.diff(np.append(starts, k)))
            last_origin, carry = self._last.get(d.name, (None, 0))
            if origins[0] == last_origin:
                index[: (starts[1] if len(starts) > 1 else k)] += carry
            self._last[d.name] = (origins[-1], int(index[-1]) + 1)
            if d.rows is not None:
                vertices = vertex_lists(self.ext_ids(), d.rows, self.id_type)
                count = np.ones(k, np.int64)
            else:  # count-only: one row per update, its number of matches
                vertices = pa.array([[]] * k, pa.list_(self.id_type))
                count = d.counts
            batch = pa.record_batch([
                pa.array([d.name] * k, pa.string()),
                pa.array(d.sign, pa.int8()),
                pa.array(d.seq, pa.int64()),
                pa.array([r.source for r in recs], pa.string()),
                vertices,
                pa.array(count, pa.int64()),
                pa.array([o[0] for o in origins], pa.string()),
                pa.array([o[1] for o in origins], pa.int32()),
                pa.array([o[2] for o in origins], pa.int64()),
                pa.array(index, pa.int64()),
            ], schema=self.schema)
            out.append((d.name, batch, [origins[i] for i in starts.tolist()]))
        return out
