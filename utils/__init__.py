"""Process, timing and logging helpers shared by the runner and the workers."""
