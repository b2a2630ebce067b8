"""recprof's own captures of real jobs on one H100 (../shared/gpu/SOURCES.md): each set's
capture folders, one per "node". Kept out of `traces/` (the decoding references scan every set
there), so the tests name them here, one by one."""

GPU_SETS = {
    "timesliced_sync": ("node0", "node1"),
    "timesliced_fwp_dbp": ("node0", "node1"),
    "mps_sync": ("node0", "node1"),
    "one_gpu": ("run",),
}
