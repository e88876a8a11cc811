"""Small helpers the test modules share (the fixtures are in conftest.py): the benchmark datasets,
the continuous engines to run on, Arrow update records, stream lines for the text readers."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from csmd.backends import gpu_unavailable_reason
from csmd.testing.kafka import REPO

DATASETS = Path(os.environ.get("CSMD_DATASETS", REPO.parent / "shared" / "datasets"))

# the continuous engines that test_continuous runs every case on: compiled (numba), numpy, GPU
ENGINES = ["cpu", "numpy", pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
    gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))])]


def dataset(name: str) -> Path:
    path = DATASETS / name
    if not path.exists():
        pytest.skip(f"dataset {path} not present (set CSMD_DATASETS)")
    return path


def read_expected(path: Path) -> dict[str, int]:
    """`name:count` or `name: count` lines."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            name, count = line.split(":")
            out[name.strip()] = int(count)
    return out


def arrow_message(columns: dict) -> bytes:
    """One Arrow IPC stream of one record batch of `columns` (name: values or an Arrow array): an
    input record in the arrow format."""
    sink = pa.BufferOutputStream()
    batch = pa.record_batch(columns)
    with ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def host(weights):
    """A sampler's weights on the host (a CuPy array copied back, a NumPy one as it is)."""
    return weights.get() if hasattr(weights, "get") else weights


# text update lines (templates: a and b ids, l a label) that the compiled stream reader
# (FileSource.read) takes in blocks, and odd ones that it leaves to the line parser
PLAIN = ["e {a} {b}", "e {a} {b} {l}", "-e {a} {b}", "-e {a} {b} {l}", "v {a} {l}", "-v {a}", "\te\t{a}  {b}\t{l} ",
         "e {a} {b} {l}\r", "  ", "", "# a comment", "   #e 1 2", "v {a} -0", "e 000{a} -0 00{l}"]
ODD = ["e {a}", "e {a} {b} {l} 7", "x {a} {b}", "e +{a} {b}", "e {a} {b} -{l}", "e {a} {b} 2147483648",
       "e 9223372036854775807 {b}", "e -9223372036854775808 {b}", "e 9223372036854775808 {b}",
       "e 1234567890123456789 {b}", "v {a}", "-v {a} {b}", "e {a}\x0c{b}", "e {a} {b}\x85", "e {a} ½",
       "{{\"op\": \"e\"}}", "e- {a} {b}", "ev {a} {b}", "e {a} - {b}", "e {a} {b} 0x1", "e {a}_1 {b}", "-",
       "e\x0b{a} {b}", "e {a} {b}\udcff"]  # \udcff: the byte 0xff, not UTF-8
