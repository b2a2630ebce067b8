"""`recprof compare`: runs side by side in the terms that decide a recommendation job's scaling
(throughput, scaling factor, stages, collectives by purpose, findings), with a regression gate."""
