"""recprof: profile, diagnose and tune distributed training of embedding-heavy recommenders."""

__version__ = "0.1.0"


def step() -> None:
    """End the current training step under `recprof capture` (custom loops whose steps are not
    one torch optimizer step). A no-op otherwise; never imports torch."""
    from recprof.capture.hook import step as capture_step

    capture_step()
