"""FileSink writes on a thread of its own: in order, acknowledged once written, failures raised."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from csmd.connectors.files import FileSink

SCHEMA = pa.schema([("x", pa.int64())])


def piece(x: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([x, x + 1])], schema=SCHEMA)


def test_the_writes_land_in_order_each_acknowledged_after_it_is_written(tmp_path):
    sink, acked = FileSink(tmp_path / "out.arrow", SCHEMA), []

    def items(w):  # taken later, on the sink's thread
        for i in range(2):
            yield None, piece(10 * w + i), [(w, i)]

    for w in range(3):
        sink.write(items(w), acked.extend)
    sink.close()
    f = ipc.open_file(tmp_path / "out.arrow")
    assert [f.get_batch(i).column("x").to_pylist()[0] for i in range(f.num_record_batches)] == [0, 1, 10, 11, 20, 21]
    assert acked == [(w, i) for w in range(3) for i in range(2)]


def test_a_failed_write_is_raised_by_the_next_write_or_by_close(tmp_path):
    def failing():
        yield None, piece(0), []
        raise OSError(28, "No space left on device")

    sink = FileSink(tmp_path / "out.arrow", SCHEMA)
    sink.write(failing())
    with pytest.raises(OSError, match="No space"):
        sink.close()
    sink = FileSink(tmp_path / "again.arrow", SCHEMA)
    sink.write(failing())
    with pytest.raises(OSError, match="No space"):  # by the third write: the second waited for the first's turn
        for _ in range(3):
            sink.write(iter([(None, piece(1), [])]))
    with pytest.raises(OSError):
        sink.close()


def test_a_file_there_is_replaced_and_a_symlink_written_through(tmp_path):
    """An old file's bytes are all gone (it is removed first, not truncated: a longer old file
    leaves nothing behind); a symlink stays one, its target holding the new file."""
    import os

    for path in (tmp_path / "out.arrow", tmp_path / "link.arrow"):
        target = tmp_path / "out.arrow"
        target.write_bytes(b"x" * 100_000)
        if path != target:
            path.symlink_to(target)
        sink = FileSink(path, SCHEMA)
        sink.write([(None, piece(7), [])])
        sink.close()
        assert os.path.islink(path) == (path != target)
        f = ipc.open_file(target)
        assert f.num_record_batches == 1 and f.get_batch(0).column("x").to_pylist() == [7, 8]
        assert target.stat().st_size < 100_000


def test_a_file_whose_folder_we_may_not_change_is_truncated(tmp_path, monkeypatch):
    """Where the old file cannot be removed (its folder is not ours to change), it is truncated."""
    import os

    def refused(path):
        raise PermissionError(13, "Permission denied", str(path))

    (tmp_path / "out.arrow").write_bytes(b"x" * 100_000)
    monkeypatch.setattr(os, "unlink", refused)
    sink = FileSink(tmp_path / "out.arrow", SCHEMA)
    sink.write([(None, piece(3), [])])
    sink.close()
    assert ipc.open_file(tmp_path / "out.arrow").get_batch(0).column("x").to_pylist() == [3, 4]
    assert (tmp_path / "out.arrow").stat().st_size < 100_000
