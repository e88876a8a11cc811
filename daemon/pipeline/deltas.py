"""Match deltas as Arrow record batches with deterministic ids (the replay file and the output topic).

A delta's id is (input, partition, offset, query, index): the input record that
caused it and its number among that record's deltas for the query. Its key,
headers and fields are what that record's context carries (Update.context).
Deltas leave the executor in a fixed order (by update, then by match), so the same delta gets
the same id in every run, whatever the batching, and a consumer can drop the
duplicates that a restart after a crash re-sends.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from csmd.pipeline.sequencer import BlockRecords
from csmd.schemas import deltas_schema

from csmd.model.arrow_writer import vertex_lists
from csmd.model.graph import id_array


class DeltaEncoder:
    """Turns each batch's deltas into one record batch per query, in update order."""

    def __init__(self, vertices, carry=None):
        self.vertices = vertices  # the sequencer's vertex table
        # its ids as an array to gather matches from: int64, or objects for string ids (never
        # fixed-width unicode, which cut ids made by the stream to the initial graph's longest);
        # grown by doubling as the stream makes vertices, the first _n of it filled
        self._ext = id_array(vertices.ext_ids, vertices.str_ids)
        self._n = len(self._ext)
        self.id_type = pa.string() if vertices.str_ids else pa.int64()
        # the names of the carried headers and fields (connectors.records.Carry; None: none)
        self.carry_headers, self.carry_fields = (carry.headers, carry.fields) if carry is not None else ((), ())
        self.schema = deltas_schema(self.id_type)
        self._map_types = (self.schema.field("headers").type, self.schema.field("fields").type)
        # per query: the origin of its last delta and the next index for that origin; an
        # input record's updates may span two batches, so its numbering carries over (from one
        # result to the next in stream order only: a gained shard's re-match goes back to records
        # numbered before, from their start, and the stream after it goes on from the last batch)
        self._last: dict[str, tuple[tuple, int]] = {}

    def ext_ids(self) -> np.ndarray:
        """Every vertex's id by internal id (and unfilled room past them: matches never name it)."""
        ext_ids, n = self.vertices.ext_ids, self._n
        if len(ext_ids) > n:  # vertices created by the stream
            if len(ext_ids) > len(self._ext):
                grown = np.empty(max(len(ext_ids), 2 * n), self._ext.dtype)
                grown[:n] = self._ext[:n]
                self._ext = grown
            self._ext[n: len(ext_ids)] = ext_ids[n:]
            self._n = len(ext_ids)
        return self._ext

    def _no_vertices(self, n: int) -> pa.Array:
        """n empty vertex lists (count-only deltas)."""
        return pa.ListArray.from_arrays(np.zeros(n + 1, np.int32), pa.array([], self.id_type))

    def encode(self, result) -> list[tuple[str, pa.RecordBatch, list[tuple]]]:
        """(query, record batch, origins in it) for every query with deltas in this batch: slices
        of one record batch, since building one costs more than its rows for the few deltas a
        query has per batch."""
        parts = [d for d in result.deltas if len(d.seq)]
        if not parts:
            return []
        record_of = result.batch.record_of
        bounds = np.cumsum([0] + [len(d.seq) for d in parts])
        n = int(bounds[-1])
        seq = np.concatenate([d.seq for d in parts])
        # the records of the distinct updates (far fewer than the rows: every query's deltas of an
        # update name it), and a code per distinct origin, so the per-row work is numpy's
        useq, inv = np.unique(seq, return_inverse=True)
        inv = inv.reshape(-1)  # numpy 2 may shape it like seq's input
        ucode, origins, usource, contexts = _records(record_of, useq)
        code = ucode[inv]
        # index: position within each run of equal origins of a query, continuing the run that
        # the query's previous batch ended with
        new = np.ones(n, bool)
        new[1:] = code[1:] != code[:-1]
        new[bounds[:-1]] = True
        starts = np.flatnonzero(new)
        index = np.arange(n, dtype=np.int64) - np.repeat(starts, np.diff(np.append(starts, n)))
        runs = np.searchsorted(starts, bounds)  # the query's runs: starts[runs[i]:runs[i + 1]]
        for i, d in enumerate(parts if result.follows else ()):  # a re-match neither reads nor moves the carry
            lo, hi = bounds[i], bounds[i + 1]
            last_origin, carry = self._last.get(d.name, (None, 0))
            if origins[code[lo]] == last_origin:
                index[lo: starts[runs[i] + 1] if runs[i] + 1 < runs[i + 1] else hi] += carry
            self._last[d.name] = (origins[code[hi - 1]], int(index[hi - 1]) + 1)
        vertices = pa.concat_arrays([
            vertex_lists(self.ext_ids(), d.rows, self.id_type) if d.rows is not None else self._no_vertices(len(d.seq))
            for d in parts]) if any(d.rows is not None for d in parts) else self._no_vertices(n)
        names = np.array([d.name for d in parts], dtype=object)
        batch = pa.record_batch([
            pa.array(np.repeat(names, np.diff(bounds)), pa.string()),
            pa.array(np.concatenate([d.sign for d in parts]), pa.int8()),
            pa.array(seq, pa.int64()),
            usource.take(inv),
            vertices,
            pa.array(np.concatenate([np.ones(len(d.seq), np.int64) if d.rows is not None else d.counts
                                     for d in parts]), pa.int64()),
            pa.array(np.array([o[0] for o in origins], object)[code], pa.string()),
            pa.array(np.array([o[1] for o in origins], np.int32)[code], pa.int32()),
            pa.array(np.array([o[2] for o in origins], np.int64)[code], pa.int64()),
            pa.array(index, pa.int64()),
            *self._context(contexts, inv),
        ], schema=self.schema)
        return [(d.name, batch.slice(bounds[i], bounds[i + 1] - bounds[i]),
                 [origins[c] for c in code[starts[runs[i]: runs[i + 1]]].tolist()]) for i, d in enumerate(parts)]

    def _context(self, contexts: list | None, inv: np.ndarray) -> list[pa.Array]:
        """The key, headers and fields columns of the rows, from the contexts of the distinct
        updates (None: none has one, the common case: no step per update)."""
        headers, fields = self._map_types
        if contexts is None:
            n = len(inv)
            return [pa.nulls(n, pa.binary()), _maps(self.carry_headers, None, n, headers),
                    _maps(self.carry_fields, None, n, fields)]
        cs = [c or (None, None, None) for c in contexts]
        return [col.take(inv) for col in (
            pa.array([c[0] for c in cs], pa.binary()), _maps(self.carry_headers, [c[1] for c in cs], len(cs), headers),
            _maps(self.carry_fields, [c[2] for c in cs], len(cs), fields))]


_NO_ENTRIES: dict = {}  # per map type, its empty entries


def _maps(names: tuple, values: list | None, m: int, typ: pa.MapType) -> pa.Array:
    """m maps, each of every one of `names` to its value in values[i] (a tuple in names' order;
    None, or values None: all null). Built from buffers: MapArray.from_arrays took some 20 us, more
    than the rest of a batch of a few deltas."""
    k = len(names)
    entries = _NO_ENTRIES.get(typ) if not k else None  # no names carried, the common case: nothing to build
    if entries is None:
        items = [x for row in values for x in (row or (None,) * k)] if values is not None else [None] * (m * k)
        entries = pa.StructArray.from_arrays([pa.array(list(names) * m, pa.string()), pa.array(items, typ.item_type)],
                                             fields=[typ.key_field, typ.item_field])
        if not k:
            _NO_ENTRIES[typ] = entries
    return pa.Array.from_buffers(typ, m, [None, pa.py_buffer(np.arange(m + 1, dtype=np.int32) * k)],
                                 children=[entries])


def _records(record_of, useq: np.ndarray) -> tuple[np.ndarray, list[tuple], pa.Array, list | None]:
    """For distinct updates (sorted): a code per update naming its input record, each code's
    origin, each update's source, and each update's context (None: no update has one). A batch
    cut from a block reads them from its columns (no Update made: a batch can have deltas for
    thousands of updates, each in every instance of a cluster)."""
    if isinstance(record_of, BlockRecords):  # rows in update order, a record's rows together
        block = record_of.block
        rows = useq - record_of.first
        at = block.lineno[rows]
        first = np.diff(at, prepend=-1) != 0  # a record's first update (offsets and lines are >= 0)
        contexts = [block.context.get(x) for x in at.tolist()] if block.context else None
        return (np.cumsum(first) - 1, [(block.path, block.partition, x) for x in at[first].tolist()],
                block.sources(rows), contexts)
    urecs = [record_of[s] for s in useq.tolist()]
    codes: dict = {}
    code = np.array([codes.setdefault(r.origin, len(codes)) for r in urecs], np.int64)
    contexts = [r.context for r in urecs]
    return code, list(codes), pa.array([r.source for r in urecs], pa.string()), \
        contexts if any(c is not None for c in contexts) else None
