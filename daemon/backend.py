"""Choosing an engine: `--backend cpu|gpu|auto`."""

from __future__ import annotations

from .errors import CsmdError

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


def resolve_backend(name: str) -> str:
    """The engine to run for `--backend name`; a clear error when the GPU is asked for and absent.

    The GPU engine is not part of this build yet, so `auto` runs the CPU engine and
    `gpu` says why it cannot run (no CuPy, no device, or no GPU engine).
    """
    if name == "gpu":
        reason = gpu_unavailable_reason() or "this build has no GPU engine yet"
        raise CsmdError(f"--backend gpu: {reason}; use --backend cpu or auto")
    return "cpu"
