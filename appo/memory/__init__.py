"""Shared memory: the trajectory slots, the small control arrays every process reads, and the named weights
segments. Torch-free: the runner creates it before forking the workers; actors see it as numpy arrays."""
