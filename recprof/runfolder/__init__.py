"""The run folder: what `recprof capture` writes and every later command reads, one home for it.

- `layout`: folder and file names, the launcher -> rank environment contract, the step log's
  format, the status vocabulary of the files, on-demand windows;
- `issue_log`: the order of each rank's collectives, as the hook writes it;
- `run`: a run of one or many node folders, opened and checked to be one job;
- `steps`: the step logs' judgements: which steps time the job, when steps have settled,
  whether a recorded window is representative.

Nothing here imports torch, the analysis or anything above it: the recorder (recprof/capture)
writes through it, and the analysis, compare and the tuner read through it.
"""
