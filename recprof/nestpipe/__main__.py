"""`torchrun --nproc_per_node P -m recprof.nestpipe --config FILE [--set k=v ...] [--out DIR]`.

Also runs without torchrun as a single in-process rank. A config problem is caught before any
process group exists, so every rank stops at once with status 2 and rank 0 prints one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from recprof.errors import ExitCode, RecprofError
from recprof.nestpipe.config import load_config, validate


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m recprof.nestpipe",
        description="NestPipe trainer, DLRM or two-tower (under torchrun for more than one "
                    "rank).",
    )
    parser.add_argument("--config", type=Path, help="YAML or TOML file of config keys")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override one config key (repeatable)")
    parser.add_argument("--out", type=Path, help="folder for metrics.jsonl and summary.json")
    parser.add_argument("--save-state", type=Path, help="write all trained parameters here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        validate(cfg, int(os.environ.get("WORLD_SIZE", "1")))
        from recprof.nestpipe.trainer import run  # torch is imported only once the config is good

        run(cfg, args.out, args.save_state)
    except RecprofError as exc:
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {exc}", file=sys.stderr, flush=True)
        else:
            # torchrun SIGTERMs the other ranks as soon as one exits: give rank 0 time to say why.
            time.sleep(2.0)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C (torchrun passes it on to every rank): one line per rank, not a traceback;
        # metrics.jsonl already holds every step that finished
        print(f"nestpipe rank {os.environ.get('RANK', '0')}: stopped by Ctrl-C", file=sys.stderr,
              flush=True)
        return ExitCode.INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
