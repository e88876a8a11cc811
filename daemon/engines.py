"""Choosing an engine (`--backend cpu|gpu|auto`, `[pipeline] backend`): the one place that does.

CuPy is optional: the GPU engine is imported only when it is chosen.
"""

from __future__ import annotations

from csmd.engine import ContinuousEngine, StaticMatcher
from csmd.errors import CsmdError
from csmd.model.graph import Graph

BACKENDS = ("cpu", "gpu", "auto")


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
    if name == "cpu":
        return "cpu"
    reason = gpu_unavailable_reason()
    if name == "gpu" and reason is not None:
        raise CsmdError(f"{setting} gpu: {reason}; use {setting} cpu or auto")
    return "cpu" if reason is not None else "gpu"


def static_matcher(backend: str) -> StaticMatcher:
    """The static matcher of a resolved backend ("cpu" or "gpu")."""
    if backend == "gpu":
        from csmd.gpu.engine import GpuMatcher

        return GpuMatcher()
    from csmd.cpu.engine import CpuMatcher

    return CpuMatcher()


def continuous_engine(backend: str, g0: Graph, setting: str = "--backend") -> ContinuousEngine:
    """A continuous engine holding g0, for `backend` (cpu, gpu or auto: the GPU when there is one)."""
    if resolve_backend(backend, setting) == "gpu":
        from csmd.gpu.engine import GpuEngine

        return GpuEngine(g0)
    from csmd.cpu.engine import CpuEngine

    return CpuEngine(g0)
