import os
from pathlib import Path

import pytest

from csmd.engines import gpu_unavailable_reason

REPO = Path(__file__).resolve().parents[1]
DATASETS = Path(os.environ.get("CSMD_DATASETS", REPO.parent / "shared" / "datasets"))


# the continuous engines that test_continuous runs every case on: compiled (numba), numpy, GPU
ENGINES = ["cpu", "numpy", pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
    gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))])]


@pytest.fixture(params=ENGINES)
def backend(request) -> str:
    return request.param


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
