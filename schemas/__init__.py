"""Arrow schemas of what csmd reads and writes, and the control messages.

Vertex ids are the user's external ids: int64 for the text formats, or string
when a graph table keyed its vertices by strings (`id_type` chooses).
"""

import pyarrow as pa

# Kafka headers that say what a record holds
CONTENT_TYPE = "content-type"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
JSON = "application/json"
TEXT = "text/plain"
SCHEMA_HEADER = "csmd-schema"
# the deltas' layout (csmd-schema header); /2 added key, headers and fields; /3 ts_min and ts_max
DELTAS_VERSION = "csmd.deltas/3"


def matches_schema(id_type: pa.DataType = pa.int64()) -> pa.Schema:
    """One row per match of a static query (`csmd match --output`)."""
    return pa.schema([
        pa.field("query", pa.string(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),  # 0-based match number within the query
        pa.field("vertices", pa.list_(id_type), nullable=False),  # data vertex of each query vertex, in query order
    ])


def deltas_schema(id_type: pa.DataType = pa.int64()) -> pa.Schema:
    """One row per vanished or new match: `csmd replay --output` and the daemon's output topic.

    (input, partition, offset, query, index) is the delta's id: the same delta gets
    the same id in every run, so a consumer drops the duplicates that at-least-once
    delivery may bring after a crash. key, headers and fields are the context of the
    input record that caused it (connectors.records.Carry): every row of one record's
    updates has its key and headers, each update its own fields.
    """
    return pa.schema([
        pa.field("query", pa.string(), nullable=False),
        pa.field("sign", pa.int8(), nullable=False),  # +1 new match, -1 vanished match
        pa.field("seq", pa.int64(), nullable=False),  # update sequence number (its timestamp)
        pa.field("source", pa.string(), nullable=False),  # where the update came from, for people
        pa.field("vertices", pa.list_(id_type), nullable=False),  # empty for count-only queries
        pa.field("count", pa.int64(), nullable=False),  # 1 per match; matches of the update when count-only
        pa.field("input", pa.string(), nullable=False),  # input topic (or stream file)
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),  # Kafka offset (or line number) of the update record
        pa.field("index", pa.int64(), nullable=False),  # delta number within (input record, query)
        pa.field("key", pa.binary()),  # the input record's Kafka key; null: none (or a stream file)
        # every name of [output] carry_headers, with the record's (last) value of that header or null
        pa.field("headers", pa.map_(pa.string(), pa.binary()), nullable=False),
        # every name of [output] carry_fields, with the update's value (JSON object field or Arrow
        # column) as JSON text, or null where it has none (and for text updates)
        pa.field("fields", pa.map_(pa.string(), pa.string()), nullable=False),
        # last, so that the columns before keep their positions of csmd.deltas/2
        pa.field("ts_min", pa.int64()),
        pa.field("ts_max", pa.int64()),
    ])


def updates_schema() -> pa.Schema:
    """Update records as Arrow: one row per update (`op` is e, -e, v or -v).

    `v` is unused by vertex ops and `label` is optional (0); ids are int64 or string. `ts` is an
    edge update's event time (optional; required on edge rows under [graph] time = "event").
    """
    return pa.schema([
        pa.field("op", pa.string(), nullable=False),
        pa.field("u", pa.int64(), nullable=False),
        pa.field("v", pa.int64()),
        pa.field("label", pa.int32()),
        pa.field("ts", pa.int64()),
    ])


# Control messages (JSON objects on the control topic):
#   {"op": "add", "name": N, "query": "<query graph text>", "count_only": false, "distinct": false}
#     distinct: one delta per subgraph instance (the embedding that keeps `csmd match --distinct`'s
#     symmetry-breaking constraints over internal vertex ids) instead of one per automorphism;
#     absent means false. Like count_only it is part of the query's spec, kept in checkpoints.
#   {"op": "remove", "name": N}
#   {"op": "applied", "request": OFFSET, "name": N, "action": "add"|"remove",
#    "at": {"PARTITION": OFFSET, ...}, "seq": S, "error": null | reason}
#     written by the daemon: request OFFSET took effect before the input record at
#     `at` (the next record of each partition) and update S.


def id_type_of(ext_ids) -> pa.DataType:
    return pa.string() if getattr(ext_ids, "dtype", None) is not None and ext_ids.dtype.kind in "OUS" else pa.int64()
