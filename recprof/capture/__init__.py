"""`recprof capture`: run a user's training command with torch.profiler injected into every rank.

Modules, one job each:
- `command`: the typer command (options, checks, the order of the stages below);
- `launcher`: runs the job in its own process group, forwards Ctrl-C, reaps leftovers;
- `inject/sitecustomize.py` + `hook`: the in-process half that every rank imports;
- `layout`: the run folder and the launcher -> rank environment contract;
- `progress`: prints what the ranks report while the job runs;
- `manifest`: what was captured, what is missing and why;
- `finish`: analyze + report at the end.

Nothing here imports torch at import time (only the hook does, once the job has imported it).
"""
