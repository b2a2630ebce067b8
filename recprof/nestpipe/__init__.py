"""NestPipe: the built-in sharded-embedding DLRM trainer that `recprof tune` turns knobs on.

Entry points: `python -m recprof.nestpipe` (under torchrun) and `recprof train`. See
docs/nestpipe.md for the config keys, outputs and `record_function` labels.
"""
