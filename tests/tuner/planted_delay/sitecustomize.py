"""A planted delay, for the tuner's tests only: a trainer rank sleeps after every optimizer step
unless its config sets one knob to one value, so that knob clearly helps.

The tests need a study where one knob's speed-up is certain, whatever the machine's noise; on
the built-in trainer no knob gives that on a CPU host (the demo is bound by host overhead).
So the delay is planted, and said to be: `RECPROF_TEST_DELAY="0.03 qcomms=fp16"` makes every
rank whose `--config` file does not hold `qcomms: fp16` sleep 30 ms after each step of its
torch optimizer (the trainer's dense optimizer steps once per training step; evaluation does
not step it). Nothing else changes: the trainer, its config, its step log and its throughput
are the real ones, with 30 ms more per step where the knob is off. This folder goes on
PYTHONPATH of the `recprof tune` the test starts; the tuner's own hook (tuner/inject) runs
this file as the next sitecustomize on the path.
"""

import os
import sys

_SPEC = os.environ.get("RECPROF_TEST_DELAY")


def _plant(spec: str) -> None:
    import yaml

    seconds, condition = spec.split()
    knob, wanted = condition.split("=", 1)
    with open(sys.argv[sys.argv.index("--config") + 1]) as fh:
        config = yaml.safe_load(fh) or {}
    if config.get(knob) == yaml.safe_load(wanted):
        return
    import time

    from torch.optim.optimizer import register_optimizer_step_post_hook

    def sleep(optimizer: object, args: object, kwargs: object) -> None:
        time.sleep(float(seconds))

    register_optimizer_step_post_hook(sleep)


if _SPEC and os.environ.get("RANK", "").isdigit() and "--config" in sys.argv:
    _plant(_SPEC)
