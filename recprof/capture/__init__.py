"""`recprof capture`: run a user's training command with torch.profiler injected into every rank.

Modules, one job each:
- `command`: the typer command (options, checks, the order of the stages below);
- `launcher`: runs the job in its own process group, forwards Ctrl-C, reaps leftovers;
- `inject/sitecustomize.py` + `hook`: the in-process half that every rank imports; `hook` wires
  `step_clock` (step boundaries and the step log), `profiler_window` (torch.profiler from the
  first step to the trace file), `rank_meta` (the rank's metadata file) and `rank_voice`
  (progress events and warnings), and records how the rank ends;
- `layout`: what both halves share: the run folder, the launcher -> rank environment contract,
  the step log's format and the status vocabulary of the files;
- `progress`: prints what the ranks report while the job runs;
- `manifest`: what was captured, what is missing and why;
- `window_check`: whether the recorded window is representative of the run;
- `finish`: analyze + report at the end.

Nothing here imports torch at import time (only the hook does, once the job has imported it).
"""
