"""Choosing an engine (`--backend cpu|numpy|gpu|auto`, `[pipeline] backend`), and the sampler of
`csmd estimate`: the one place that does.

CuPy is optional: the GPU engine is imported only when it is chosen. `cpu` is the
compiled CPU engine (numba); where numba cannot be imported it is the numpy engine,
which `numpy` also names (the fallback, and the reference the compiled one is tested
against).
"""

from __future__ import annotations

import time

import numpy as np

from csmd.engine import ContinuousEngine, StaticMatcher
from csmd.errors import CsmdError
from csmd.model.graph import Graph
from csmd.model.plan import Plan

BACKENDS = ("cpu", "numpy", "gpu", "auto")


def gpu_unavailable_reason() -> str | None:
    """None when CuPy sees a CUDA device, else why not."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'csmd[gpu]')"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # CUDARuntimeError and driver errors alike
        return f"CUDA is not usable: {exc}"
    return None


def resolve_backend(name: str, setting: str = "--backend") -> str:
    """The engine to run for `--backend name`: "cpu" or "gpu".

    `auto` takes the GPU when CuPy sees one; `gpu` raises a clear error, naming
    `setting`, when it cannot run.
    """
    if name not in BACKENDS:
        raise CsmdError(f"{setting}: unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
    if name in ("cpu", "numpy"):
        return name
    reason = gpu_unavailable_reason()
    if name == "gpu" and reason is not None:
        raise CsmdError(f"{setting} gpu: {reason}; use {setting} cpu or auto")
    return "cpu" if reason is not None else "gpu"


_numba_missing = False


def _compiled():
    """The compiled CPU engine's module, or None (said once in the log) where numba cannot be imported."""
    global _numba_missing
    try:
        from csmd.cpu import compiled
    except ImportError as exc:
        if not _numba_missing:
            from csmd.logs import get_logger  # structlog: imported where a log line is made

            _numba_missing = True
            get_logger().warning("numba cannot be imported: the CPU backend runs the numpy engine", error=str(exc))
        return None
    return compiled


def static_matcher(backend: str, gpus: int | str = 1, gpus_setting: str = "--gpus") -> StaticMatcher:
    """The static matcher of a resolved backend ("cpu", "numpy" or "gpu"); gpus: the GPU
    matcher's devices, as continuous_engine takes them (several: each query's roots split
    over them)."""
    devices = gpu_devices(backend, gpus, gpus_setting)
    if devices:
        from csmd.gpu.engine import GpuMatcher

        return GpuMatcher(devices if len(devices) > 1 else None)
    compiled = _compiled() if backend == "cpu" else None
    if compiled is not None:
        return compiled.CompiledMatcher()
    from csmd.cpu.numpy_engine import CpuMatcher

    return CpuMatcher()


def continuous_engine(backend: str, g0: Graph, setting: str = "--backend", threads: int | None = None,
                      timed: bool = False, gpus: int | str = 1, gpus_setting: str = "--gpus") -> ContinuousEngine:
    """A continuous engine holding g0, for `backend` (cpu, gpu or auto: the GPU when there is one);
    threads: the compiled engine's (None: CSMD_THREADS, else the cores); timed: under event time
    (its graph keeps every edge's ts, its searches the queries' time constraints); gpus: the GPU
    engine's devices (a count or "all"; gpus_setting names it in errors)."""
    resolved = resolve_backend(backend, setting)
    devices = gpu_devices(resolved, gpus, gpus_setting)
    if len(devices) > 1:
        from csmd.gpu.replicas import MultiGpuEngine

        return MultiGpuEngine(g0, devices, timed)
    if devices:
        from csmd.gpu.engine import GpuEngine

        return GpuEngine(g0, timed=timed)
    compiled = _compiled() if backend != "numpy" else None
    if compiled is not None:
        return compiled.CompiledEngine(g0, threads, timed)
    from csmd.cpu.numpy_engine import CpuEngine

    return CpuEngine(g0, timed)


def gpu_devices(resolved: str, gpus: int | str = 1, gpus_setting: str = "--gpus") -> list[int]:
    """The devices an engine of the resolved backend ("cpu", "numpy", "gpu") runs on: none for a
    CPU engine (an error where gpus asks for several: not a silent run on the CPU), else the
    first `gpus` devices or "all" (an error naming gpus_setting where the machine has fewer)."""
    if resolved == "gpu":
        from csmd.gpu.replicas import device_ids

        return device_ids(gpus, gpus_setting)
    if gpus not in (1, "all"):
        reason = gpu_unavailable_reason()
        raise CsmdError(f"{gpus_setting} {gpus}: the {resolved} backend runs on the CPU"
                        f"{f' ({reason})' if reason else ''}; use the gpu backend on a machine with GPUs, or 1")
    return []


def sampler_backend(name: str, directed: bool = False) -> str:
    """The sampler for `--backend name`: "cpu" or "gpu" (auto: the GPU where CuPy sees one; for a
    directed graph the CPU sampler: the GPU's does not read one yet)."""
    return "gpu" if not directed and resolve_backend(name) == "gpu" else "cpu"


def make_sampler(backend: str, g: Graph, plan: Plan, method: str, seed: int, trawl: int = 0):
    """The CpuSampler or GpuSampler ("cpu" / "gpu") of one planned query, with its candidate graph
    (the GPU's built on the device or uploaded, whichever is faster for this graph and plan)."""
    if backend == "gpu":
        from csmd.gpu.sampler import GpuSampler, candidates

        return GpuSampler(plan, candidates(g, plan), method, seed, trawl=trawl)
    from csmd.cpu.sampler import CpuSampler
    from csmd.model.estimate import CandidateGraph

    return CpuSampler(g, CandidateGraph(g, plan), method, seed, trawl)


_warmed: set = set()  # (backend, device) pairs warmed in this process (device None: the CPU's)


def warm_once(backend: str, gpus: int | str = 1, gpus_setting: str = "--gpus") -> float:
    """warm_up(backend) the first time this process asks for it, on the GPU on each device `gpus`
    names (each loads its own modules); its seconds (0 after that)."""
    devices = gpu_devices(backend, gpus, gpus_setting) or [None]
    seconds = 0.0
    for device in devices:
        if (backend, device) in _warmed:
            continue
        if device is None:
            seconds += warm_up(backend)[0]
        else:
            import cupy

            with cupy.cuda.Device(device):
                seconds += warm_up(backend)[0]
        _warmed.add((backend, device))
    return seconds


# edge and vertex inserts and deletes, one of each kind of batch the real stream may bring
_WARM_UP_STREAM = ("e 0 2 0", "e 1 3 0", "v 9 0", "e 9 0 0", "e 9 1 1", "-e 0 2 0", "-v 9", "e 0 3 0", "e 2 3 0")


def warm_up(backend: str) -> tuple[float, dict[str, int]]:
    """Run a tiny stream through a throwaway engine of the resolved `backend` ("cpu", "numpy",
    "gpu") with a count-only and a materialized triangle: the compiled code (numba's cache,
    the CUDA modules) loads here, at start, instead of in the first batch of the real stream
    (some 0.3 s on the compiled CPU engine), and the graph's compaction, instead of in the
    first one (compiled there, it held the updater stage 0.45 s on a busy device host).
    On the GPU it also applies one batch too large for the one-block updater, sorts its
    materialised rows on the device (gpu/drains.py, a large search's path), and returns
    replaced versions to the pool: CuPy compiles (or loads from its disk cache) each of its
    own kernels that those paths use (sorts, prefix sums, gathers, masks) on first use, 10 to
    100 ms each (with none cached, the drains' three held a stream's first materialised
    batch). Returns the seconds it took and the deltas per query (proof that the matching
    paths ran)."""
    from csmd.cpu.numpy_engine import CpuEngine
    from csmd.model.formats import UpdateBlock, parse_update
    from csmd.pipeline.stages import Pipeline

    t0 = time.monotonic()
    # four vertices for the triangles; label-1 vertices (ids from 100) for the GPU's large batch
    big = 130 if backend == "gpu" else 0
    g0 = Graph.from_edges([0] * 4 + [1] * big, [0, 1, 2], [1, 2, 3], [0] * 3, [0, 1, 2, 3, *range(100, 100 + big)])
    tri = Graph.from_edges([0] * 3, [0, 1, 0], [1, 2, 2], [0] * 3)
    # one device's engine, on the current device (warm_once runs this on each device an engine uses)
    pipe = Pipeline(g0, engine=continuous_engine(backend, g0), batch_size=3, threaded=False)
    pipe.add_query("count", tri, True)
    pipe.add_query("rows", tri, False)
    pipe.warm()
    deltas = {"count": 0, "rows": 0}

    def tally(result):
        for d in result.deltas:
            deltas[d.name] += d.positive + d.negative

    try:
        pipe.run((parse_update(line, "warm-up", i) for i, line in enumerate(_WARM_UP_STREAM)), tally)
        pipe.engine.stats()  # returns the freed versions to the pool (the GPU's release path)
        if isinstance(pipe.engine, CpuEngine):  # a stream compacts once it freed 64K entries: not this one
            pipe.engine.mvg.compact()
        if big:
            # a triangle's edge out and back in, its rows sorted on the device as a large search's are
            pipe.engine.executor.sort_rows = 1
            pipe.run((parse_update(line, "warm-up", i) for i, line in enumerate(("-e 0 3 0", "e 0 3 0"))), tally)
            # the edges among the label-1 vertices, in one batch of more rows than small_rows
            k = pipe.engine.mvg.small_rows // 2 + 1
            u, v = (x[:k] + 100 for x in np.triu_indices(big, 1))
            assert len(u) == k, "the warm-up's large batch needs more vertices"
            pipe.batch_size = pipe.max_batch = k
            pipe.run([UpdateBlock("warm-up", np.arange(k), np.zeros(k, np.int8), u, v, np.zeros(k, np.int64))],
                     tally)
            pipe.engine.stats()
            pipe.engine.mvg.warm_release()
    finally:
        pipe.engine.close()
    return time.monotonic() - t0, deltas
