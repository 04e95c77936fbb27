"""The metrics computed from a capture (the numpy twins and the compiled kernels share primitives here)."""
