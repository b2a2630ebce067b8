"""Why a distributed job hangs (or failed inside a collective): which rank, which collective,
which line of the user's code, and what to do.

Below the flows so that a live capture (recprof/flows/hang.py), `recprof analyze` and `recprof
report` all make the same diagnosis from the same records:
- `records`: what each rank left (torch's flight recorder dumps, capture's issue log and hang
  dump, metadata, fatal reports), read into one shape;
- `diagnose`: the cross-rank matching and the problems it finds;
- `model`: the diagnosis (schema recprof.hang/1);
- `text`: its short text report;
- `sources`: finding dumps among a command's paths, and writing a diagnosis into a run folder.
"""
