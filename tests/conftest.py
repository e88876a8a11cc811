"""The fixtures every test module may use; the helper functions are in helpers.py, brute.py,
static_cases.py, continuous_cases.py and csmd.testing (the daemon run against a broker)."""

import os

import pytest

from csmd.model.formats import read_graph, read_query
from csmd.testing.kafka import QUERIES, kill_leftovers, replay_rows
from helpers import ENGINES, dataset, read_expected


@pytest.fixture(params=ENGINES)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    """A Kafka-protocol broker: the cluster named by KAFKA_BOOTSTRAP, else the embedded Tansu broker."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    from csmd.connectors.broker import EmbeddedBroker

    broker = EmbeddedBroker(log_path=tmp_path_factory.mktemp("broker") / "tansu.log").start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Replay's deltas of the human stream for the daemon tests' QUERIES."""
    return replay_rows(QUERIES, tmp_path_factory.mktemp("ref"))


@pytest.fixture(scope="module")
def hprd_queries():
    """HPRD and its queries with their expected counts: (graph, {name: (query, count)})."""
    root = dataset("hprd")
    g = read_graph(root / "data.graph")
    expected = read_expected(root / "expected_counts.txt")
    return g, {name: (read_query(root / "queries" / f"{name}.graph"), count) for name, count in expected.items()}


@pytest.fixture(autouse=True)
def _no_leftover_daemons():
    """Daemons a test started (DaemonProcess) are killed after it, whether it passed or not."""
    yield
    kill_leftovers()
