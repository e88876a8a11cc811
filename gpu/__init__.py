"""The GPU engine: CUDA C++ kernels (.cu and .cuh, compiled with cupy.RawModule) and their CuPy drivers."""
