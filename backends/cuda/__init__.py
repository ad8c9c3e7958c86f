"""The CUDA backend: our own kernels (`kernels/*.cu`) over a small device interface
(`device.Device`) with two implementations, PyCUDA on a real GPU and a CPU emulator that
compiles the same source with the host C++ compiler (`emulator/`)."""
