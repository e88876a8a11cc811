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
    """The engine to run for `--backend name`; a clear error when the GPU is asked for and absent."""
    if name == "cpu":
        return "cpu"
    reason = gpu_unavailable_reason()
    if name == "gpu" and reason:
        raise CsmdError(f"--backend gpu: {reason}; use --backend cpu or auto")
    if reason:
        return "cpu"
    try:
        import csmd.gpu.matcher  # noqa: F401
    except ImportError:
        if name == "gpu":
            raise CsmdError("--backend gpu: this build has no GPU matcher yet; use --backend cpu or auto") from None
        return "cpu"
    return "gpu"
