"""Imported at start-up by every Python process of a job run under `recprof capture`.

`recprof capture` prepends this folder to PYTHONPATH, so torchrun's workers (and a plain
`python train.py`) load the profiler hook without any change to the user's script. A
sitecustomize that was already on the path is shadowed by this one, so it is found and run
first. Failures only print a warning: capture must never stop the user's job.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed_sitecustomize() -> None:
    """Execute the next `sitecustomize` on sys.path (a virtualenv's or the site's own)."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _activate() -> None:
    """Hand over to the in-process hook, which decides whether this process is a rank."""
    try:
        from recprof.capture import hook

        hook.activate()
    except Exception as exc:
        print(f"[recprof] capture inactive in this process: {exc!r}", file=sys.stderr)


_run_shadowed_sitecustomize()
if os.environ.get("RECPROF_CAPTURE_DIR"):
    _activate()
