"""Arrow schemas of what csmd reads and writes.

Vertex ids are the user's external ids: int64 for the text formats, or string
when a graph table keyed its vertices by strings (`id_type` chooses).
"""

import pyarrow as pa


def matches_schema(id_type: pa.DataType = pa.int64()) -> pa.Schema:
    """One row per match of a static query (`csmd match --output`)."""
    return pa.schema([
        pa.field("query", pa.string(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),  # 0-based match number within the query
        pa.field("vertices", pa.list_(id_type), nullable=False),  # data vertex of each query vertex, in query order
    ])


def deltas_schema(id_type: pa.DataType = pa.int64()) -> pa.Schema:
    """One row per vanished or new match (`csmd replay --output`, the daemon's output topic)."""
    return pa.schema([
        pa.field("query", pa.string(), nullable=False),
        pa.field("sign", pa.int8(), nullable=False),  # +1 new match, -1 vanished match
        pa.field("seq", pa.int64(), nullable=False),  # update sequence number (its timestamp)
        pa.field("source", pa.string(), nullable=False),  # where the update came from: file:line, topic/partition/offset
        pa.field("vertices", pa.list_(id_type), nullable=False),
    ])


def id_type_of(ext_ids) -> pa.DataType:
    return pa.string() if getattr(ext_ids, "dtype", None) is not None and ext_ids.dtype.kind in "OUS" else pa.int64()
