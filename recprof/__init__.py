"""recprof: profile, diagnose and tune distributed training of embedding-heavy recommenders."""

from recprof.version import __version__

__all__ = ["__version__", "step"]


def step() -> None:
    """End the current training step under `recprof capture` (custom loops whose steps are not
    one torch optimizer step). A no-op otherwise; never imports torch."""
    from recprof.capture.hook import step as capture_step

    capture_step()
