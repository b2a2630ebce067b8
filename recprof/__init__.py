"""recprof: profile, diagnose and tune distributed training of embedding-heavy recommenders."""

__version__ = "0.1.0"
