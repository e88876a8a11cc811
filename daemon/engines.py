"""Choosing an engine: `--backend cpu|gpu|auto`."""

from __future__ import annotations

from csmd.errors import CsmdError

BACKENDS = ("cpu", "gpu", "auto")


def gpu_unavailable_reason() -> str | None:
    """None when CuPy sees a CUDA device, else why not (imported lazily: CuPy is optional)."""
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


def resolve_backend(name: str, gpu_engine: bool = False) -> str:
    """The engine to run for `--backend name`: "cpu" or "gpu".

    gpu_engine: whether the command has a GPU engine (static matching has; the
    continuous pipeline not yet). `auto` takes the GPU when there is one and the
    command can use it; `gpu` raises a clear error when it cannot run.
    """
    if name == "cpu":
        return "cpu"
    reason = gpu_unavailable_reason()
    if reason is None and not gpu_engine:
        reason = "this command has no GPU engine yet"
    if name == "gpu" and reason is not None:
        raise CsmdError(f"--backend gpu: {reason}; use --backend cpu or auto")
    return "cpu" if reason is not None else "gpu"
