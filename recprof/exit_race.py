"""Keep torch.distributed jobs from aborting at exit with "terminate called without an active
exception" (SIGABRT) after their work is done.

What happens (torch 2.13, CPU/gloo; the backtraces and counts are in docs/capture.md,
"Exit aborts"): `torch/distributed/nn/functional.py` declares `group=group.WORLD` as default
arguments, evaluated when the module is imported. When that import happens after
`init_process_group` (and it does: `torch._dynamo` imports it, the optimizer's first `step()`
imports `torch._dynamo`, and so does every `torch.profiler` session through
`hasattr(torch, "_inductor")`), ten function defaults hold the default process group forever.
`destroy_process_group()` then cannot free the C++ `ProcessGroupGloo`, its `pt_gloo_runloop`
threads live on into interpreter finalization, and a runloop thread that is still releasing the
last collective's tensors must take the GIL there; Python ends such a thread with
`pthread_exit`, whose forced unwind meets a `noexcept` frame and calls `std::terminate`.

Importing that module before the process group exists binds the defaults to `None` (the
default group, looked up at call time), so `destroy_process_group()` joins the gloo threads and
nothing is left to race with finalization. Measured: 4 aborts in 40 runs of
tests/jobs/profiled_gloo_job.py without this import, 0 in 60 with it.

Only for programs whose last reference to the group is dropped by `destroy_process_group()`
itself (torch releases the GIL there). Where a C++ object holds the group and is freed with the
GIL held, an unpinned group's destructor joins the gloo threads under the GIL, and a runloop
thread waiting for the GIL to free a tensor deadlocks. DDP's `Reducer` is such an object: with
this import, examples/ddp_sharded_embedding.py under capture once hung in
`~Reducer -> ~ProcessGroupGloo -> std::thread::join` while `pt_gloo_runloop` sat in `take_gil`.
So recprof calls it in the jobs it owns (the built-in trainer, the test jobs), never in a user's
job: there `recprof capture` keeps the job's own import order and reports an abort at exit as
exactly that (manifest `exit.status` "aborted_at_exit").
"""

from __future__ import annotations

import sys

#: The module whose import-time defaults pin the default process group.
_PINNING_MODULE = "torch.distributed.nn.functional"


def avoid_gloo_exit_abort() -> None:
    """Import the module that would pin the default process group, while none exists yet.

    Call it before `init_process_group`. A no-op when the module is already imported or
    torch has no distributed support; costs about 4 ms once.
    """
    if _PINNING_MODULE in sys.modules:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    if dist.is_initialized():
        # Too late to help: the defaults would bind to the live group. Leave the import to
        # whoever needs it, as before.
        return
    __import__(_PINNING_MODULE)
