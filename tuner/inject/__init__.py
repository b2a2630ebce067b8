"""The folder `recprof tune` prepends to each trial's PYTHONPATH; it holds the injected
`sitecustomize` that records each rank's peak memory (tuner/memory.py reads what it writes).
A package so that a wheel ships that file, and so both sides read one name for the folder."""

#: The environment variable naming the folder the ranks write `rank<R>.json` into.
MEMORY_DIR_ENV = "RECPROF_TUNER_MEMORY_DIR"
