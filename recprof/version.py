"""recprof's version: one home, read by the package, the documents it writes and the Dask
workers' check that they run the same recprof. A module of its own so that reading it imports
nothing else (the package's `__init__` reaches up to the capture hook for `recprof.step`)."""

__version__ = "0.1.0"
