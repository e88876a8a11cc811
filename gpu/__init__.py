"""Device side: CUDA C++ kernels (.cu, compiled with cupy.RawModule) and their CuPy drivers."""
