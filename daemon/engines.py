"""Choosing an engine (`--backend cpu|gpu|auto`, `[pipeline] backend`): the one place that does.

CuPy is optional: the GPU engine is imported only when it is chosen.
"""

from __future__ import annotations

from csmd.engine import ContinuousEngine, StaticMatcher
from csmd.errors import CsmdError
from csmd.model.graph import Graph

BACKENDS = ("cpu", "gpu", "auto")
GPU_CONTINUOUS = True  # gpu/engine.py GpuEngine


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


def resolve_backend(name: str, gpu_engine: bool = True, setting: str = "--backend") -> str:
    """The engine to run for `--backend name`: "cpu" or "gpu".

    gpu_engine: whether the work has a GPU engine. `auto` takes the GPU when there is
    one and the work can use it; `gpu` raises a clear error, naming `setting`, when it
    cannot run.
    """
    if name not in BACKENDS:
        raise CsmdError(f"{setting}: unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
    if name == "cpu":
        return "cpu"
    reason = gpu_unavailable_reason()
    if reason is None and not gpu_engine:
        reason = "the continuous pipeline has no GPU engine yet"
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
    """A continuous engine holding g0, for `backend` (cpu, gpu or auto).

    `auto` keeps the CPU engine for now: the GPU continuous engine matches the CPU one on
    the device's random streams, but the daemon has not yet run on it (issue 14), so it
    is taken only when asked for by name.
    """
    if backend != "auto" and resolve_backend(backend, GPU_CONTINUOUS, setting) == "gpu":
        from csmd.gpu.engine import GpuEngine

        return GpuEngine(g0)
    from csmd.cpu.engine import CpuEngine

    return CpuEngine(g0)
