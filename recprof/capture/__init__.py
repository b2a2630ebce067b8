"""The recorder behind `recprof capture` (recprof/flows/capture.py): run a user's training command
with torch.profiler injected into every rank, and write the run folder (recprof/runfolder).

Modules, one job each:
- `launcher`: runs the job in its own process group, forwards Ctrl-C, reaps leftovers;
- `inject/sitecustomize.py` + `hook`: the in-process half that every rank imports; `hook` wires
  `step_clock` (step boundaries and the step log), `profiler_window` (torch.profiler from the
  first step to the trace file), `rank_meta` (the rank's metadata file) and `rank_voice`
  (progress events and warnings), and records how the rank ends;
- `progress`: prints what the ranks report while the job runs;
- `manifest`: what was captured, what is missing and why;
- `windows`: what each on-demand window holds, for the manifest;
- `trigger`: `recprof trigger RUN`, a window asked of a running on-demand capture.

Nothing here imports torch at import time (only the hook does, once the job has imported it).
"""
