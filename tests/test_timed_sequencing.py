"""What the sequencer's batches of edge records rely on: the vertex table."""

from __future__ import annotations

import numpy as np
import pytest

from csmd.model.graph import Graph
from csmd.pipeline.sequencer import Vertices


@pytest.mark.parametrize("ext", [[-5, 3, 7], [3, 7, 10**6]])
def test_a_vertex_table_made_later_holds_the_ids_before_it(ext):
    """A graph whose ids kept it from an id table (a negative one, one too sparse) gets one when
    a vertex with a small id comes: it must hold the ids already there (an id read as unknown
    sends a batch down the record-by-record path, or reads as a missing edge in a deletion)."""
    vx = Vertices(Graph.from_edges([0, 0, 0], [], [], ext_ids=np.array(ext)))
    vx.add(1, 0)
    assert vx.lookup(np.array([3, 7, 1])).tolist() == [1 if ext[0] < 0 else 0, 2 if ext[0] < 0 else 1, 3]
