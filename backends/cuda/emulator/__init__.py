"""The CUDA emulator: the backend's `.cu` kernels compiled by the host C++ compiler (`build.py`), each CUDA
thread run as a fiber (`fibers.cpp`), so kernels are tested on machines without a GPU."""
