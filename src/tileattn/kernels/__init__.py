"""Pure ``@triton.jit`` kernels: no torch, no allocation, no validation."""
