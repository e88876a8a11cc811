"""Match deltas as Arrow record batches with deterministic ids (the replay file and the output topic).

A delta's id is (input, partition, offset, query, index): the input record that
caused it and its number among that record's deltas for the query. Its key,
headers and fields are what that record's context carries (Update.context).
Deltas leave the executor in a fixed order (by update, then by match), so the same delta gets
the same id in every run, whatever the batching, and a consumer can drop the
duplicates that a restart after a crash re-sends.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from csmd.pipeline.sequencer import BlockRecords
from csmd.schemas import deltas_schema

from csmd.model.arrow_writer import vertex_lists
from csmd.model.graph import id_array
from csmd.model.time_constraints import NO_TS

# A batch's deltas leave the encoder in pieces (record batches) of at most MAX_ROWS rows, so that
# their Arrow form takes bounded memory (some 200 bytes a row) however many deltas a batch has;
# and of at most MAX_VALUES vertex ids, the most a list array's int32 offsets can address. Both are
# module constants so that tests can force small pieces.
MAX_ROWS = 1 << 20
MAX_VALUES = (1 << 31) - 1


class DeltaEncoder:
    """Turns each batch's deltas into record batches: per query in update order, or the whole batch by update."""

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

    def encode(self, result, by_update: bool = False) -> Iterator[tuple[str | None, pa.RecordBatch, list[tuple]]]:
        """The batch's deltas as (query, record batch, origins in it), built one piece at a time
        as the caller takes them, so that a batch's Arrow form is never all in memory: each piece
        at most MAX_ROWS rows and MAX_VALUES vertex ids. By query (the output topic's records,
        keyed by query), or by_update: in the file's order, by update, then query, then match
        (query None). The ids are numbered here, before the first piece is taken."""
        rows = self._rows(result)
        return iter(()) if rows is None else rows.pieces(self, by_update)

    def _rows(self, result) -> _Rows | None:
        """The batch's deltas as numpy arrays, one entry per row, by query (None: no deltas)."""
        parts = [d for d in result.deltas if len(d.seq)]
        if not parts:
            return None
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
        return _Rows(parts, bounds, seq, inv, code, index, origins, usource, contexts)

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


class _Rows:
    """A batch's deltas as numpy arrays, one entry per row, by query (parts[i]'s rows are
    bounds[i]:bounds[i + 1]): the row's update (inv: into the distinct updates, whose sources are
    usource and contexts contexts), its origin (code: into origins), its index, and its match's
    ts_min and ts_max (ts: the two columns; None where no query's deltas have a ts)."""

    def __init__(self, parts, bounds, seq, inv, code, index, origins, usource, contexts):
        self.parts, self.bounds, self.seq, self.inv, self.code, self.index = parts, bounds, seq, inv, code, index
        self.origins, self.usource, self.contexts = origins, usource, contexts
        self.sign = np.concatenate([d.sign for d in parts])
        self.count = np.concatenate([np.ones(len(d.seq), np.int64) if d.rows is not None else d.counts for d in parts])
        self.width = np.array([0 if d.rows is None else d.rows.shape[1] for d in parts], np.int64)  # ids a row
        # column by column: a transposed copy of the (rows, 2) pairs took four times as long
        self.ts = None if all(d.ts is None for d in parts) else tuple(np.concatenate(
            [np.full(len(d.seq), NO_TS, np.int64) if d.ts is None else d.ts[:, c] for d in parts]) for c in (0, 1))
        self.qcode = np.repeat(np.arange(len(parts), dtype=np.int32), np.diff(bounds))  # each row's query
        self.names = pa.array([d.name for d in parts], pa.string())
        # each origin's input, partition and offset, which the rows take by their code
        self.inputs = pa.array([o[0] for o in origins], pa.string())
        self.partitions = np.array([o[1] for o in origins], np.int32)
        self.offsets = np.array([o[2] for o in origins], np.int64)

    def pieces(self, enc: DeltaEncoder, by_update: bool):
        if not by_update:  # each query's rows, contiguous: their vertices are a gather of its matches
            for i, d in enumerate(self.parts):
                first = int(self.bounds[i])
                for lo, hi in _cuts(np.arange(1, len(d.seq) + 1) * self.width[i]):
                    vertices = enc._no_vertices(hi - lo) if d.rows is None else \
                        vertex_lists(enc.ext_ids(), d.rows[lo:hi], enc.id_type)
                    yield d.name, self._batch(enc, slice(first + lo, first + hi), vertices), \
                        self._origins(slice(first + lo, first + hi))
            return
        # by update (stable: the queries' order within an update, each query's rows in order); its
        # rows' matches gathered from one flat array of them all
        order = np.argsort(self.inv, kind="stable")
        widths = np.repeat(self.width, np.diff(self.bounds))
        flat = np.concatenate([d.rows.reshape(-1) for d in self.parts if d.rows is not None] or [np.zeros(0, np.int32)])
        start = np.concatenate(([0], np.cumsum(widths)[:-1]))  # each row's first id in flat
        for lo, hi in _cuts(np.cumsum(widths[order])):
            at = order[lo:hi]
            ext = enc.ext_ids()  # string ids are objects, which numba cannot gather
            offsets, values = (_numpy_gather if ext.dtype == object else _gather)(flat, start, widths, at, ext)
            values = pa.array(values, enc.id_type)
            yield None, self._batch(enc, at, pa.ListArray.from_arrays(offsets, values, pa.list_(enc.id_type))), \
                self._origins(at)

    def _origins(self, at) -> list[tuple]:
        """The distinct origins of the rows `at` (a slice or indices), in their order."""
        c = self.code[at]
        return [self.origins[x] for x in c[np.append(True, c[1:] != c[:-1])].tolist()]

    def _batch(self, enc: DeltaEncoder, at, vertices: pa.Array) -> pa.RecordBatch:
        """The record batch of the rows `at` (a slice or indices)."""
        code = self.code[at]
        return pa.record_batch([
            self.names.take(self.qcode[at]),
            pa.array(self.sign[at], pa.int8()),
            pa.array(self.seq[at], pa.int64()),
            self.usource.take(self.inv[at]),
            vertices,
            pa.array(self.count[at], pa.int64()),
            self.inputs.take(code),
            pa.array(self.partitions[code], pa.int32()),
            pa.array(self.offsets[code], pa.int64()),
            pa.array(self.index[at], pa.int64()),
            *enc._context(self.contexts, self.inv[at]),
            *_ts_columns(self.ts, at, len(code)),
        ], schema=enc.schema)


def _ts_columns(ts: tuple | None, at, n: int) -> list[pa.Array]:
    """The ts_min and ts_max columns of the n rows `at` (ts: _Rows.ts), null where a match has no
    ts (NO_TS); without ts, one array of nulls for both (no numpy pass over the rows)."""
    if ts is None:
        none = pa.nulls(n, pa.int64())
        return [none, none]
    out = []
    for col in ts:
        values = np.ascontiguousarray(col[at])
        valid = values != NO_TS
        # the validity bitmap packed by numpy: pa.array(values, mask=...) took five times as long
        bits = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        out.append(pa.Array.from_buffers(pa.int64(), len(values), [bits, pa.py_buffer(values)]))
    return out


def _cuts(values: np.ndarray):
    """(lo, hi) of consecutive pieces of rows, each at most MAX_ROWS rows and MAX_VALUES vertex
    ids, given the rows' running count of ids."""
    lo, n = 0, len(values)
    while lo < n:
        before = int(values[lo - 1]) if lo else 0
        hi = min(lo + MAX_ROWS, int(np.searchsorted(values, before + MAX_VALUES, "right")))
        yield lo, hi
        lo = hi


def _numpy_gather(flat, start, widths, at, table) -> tuple[np.ndarray, np.ndarray]:
    """gather.gather_ids without numba."""
    w = widths[at]
    offsets = np.zeros(len(at) + 1, np.int64)
    np.cumsum(w, out=offsets[1:])
    return offsets.astype(np.int32), table[flat[np.repeat(start[at] - offsets[:-1], w) + np.arange(offsets[-1])]]


try:
    from csmd.pipeline.gather import gather_ids as _gather
except ImportError:  # no numba: the same in numpy, several passes over the ids
    _gather = _numpy_gather


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
