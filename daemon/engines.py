"""Choosing an engine (`--backend cpu|numpy|gpu|auto`, `[pipeline] backend`): the one place that does.

CuPy is optional: the GPU engine is imported only when it is chosen. `cpu` is the
compiled CPU engine (numba); where numba cannot be imported it is the numpy engine,
which `numpy` also names (the fallback, and the reference the compiled one is tested
against).
"""

from __future__ import annotations

from csmd.engine import ContinuousEngine, StaticMatcher
from csmd.errors import CsmdError
from csmd.model.graph import Graph
from csmd.service.logs import get_logger

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
            _numba_missing = True
            get_logger().warning("numba cannot be imported: the CPU backend runs the numpy engine", error=str(exc))
        return None
    return compiled


def static_matcher(backend: str) -> StaticMatcher:
    """The static matcher of a resolved backend ("cpu", "numpy" or "gpu")."""
    if backend == "gpu":
        from csmd.gpu.engine import GpuMatcher

        return GpuMatcher()
    compiled = _compiled() if backend == "cpu" else None
    if compiled is not None:
        return compiled.CompiledMatcher()
    from csmd.cpu.engine import CpuMatcher

    return CpuMatcher()


def continuous_engine(backend: str, g0: Graph, setting: str = "--backend", threads: int | None = None
                      ) -> ContinuousEngine:
    """A continuous engine holding g0, for `backend` (cpu, gpu or auto: the GPU when there is one);
    threads: the compiled engine's (None: CSMD_THREADS, else the cores)."""
    if resolve_backend(backend, setting) == "gpu":
        from csmd.gpu.engine import GpuEngine

        return GpuEngine(g0)
    compiled = _compiled() if backend != "numpy" else None
    if compiled is not None:
        return compiled.CompiledEngine(g0, threads)
    from csmd.cpu.engine import CpuEngine

    return CpuEngine(g0)
