"""The what-if's codec cost against the codec's own round trip, side by side in one run
(moved here from tests/whatif/test_model_parts.py, issue 50: a timing has no place in a test;
the test checks what is timed, with a counting clock).

    python benchmarks/codec_cost.py [--rows 10000] [--rounds 3]

`measure_codec` (recprof/whatif/device.py) prices fp8 per row and direction; here the same
rows go through the trainer's codec directly (the best of 20 encodes plus the best of 20
decodes, one thread), in alternation with `measure_codec`, `--rounds` times, and the best of
each is compared: this machine drifts while it runs (fp8's forward round trip timed 5.1 and
7.5 ms minutes apart in one process), so a state either side reached the other had the same
chance to reach. A ratio near 1 is the expected result; the old measure, a multiple of a
cached gather, read about 10x. Prints one row per direction: measured ms, own ms, ratio.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch

    from recprof.nestpipe.config import TrainConfig
    from recprof.nestpipe.qcomms import Codec
    from recprof.whatif.device import measure_codec

    cfg = TrainConfig(num_tables=8, num_embeddings=50_000, embedding_dim=64)
    data = torch.rand(args.rows, 64)

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(20):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times) * 1e6

    def own_round_trip(direction: str) -> float:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            codec = Codec("fp8", direction)
            wire = codec.encode(data)
            return best(lambda: codec.encode(data)) + best(lambda: codec.decode(wire, 64))
        finally:
            torch.set_num_threads(threads)

    measured: dict[str, list[float]] = {"fwd": [], "bwd": []}
    own: dict[str, list[float]] = {"fwd": [], "bwd": []}
    for _ in range(args.rounds):
        cost = measure_codec(cfg, "fp8", args.rows)
        measured["fwd"].append(cost.fwd * args.rows)
        measured["bwd"].append(cost.bwd * args.rows)
        for direction in own:
            own[direction].append(own_round_trip(direction))
    print(f"fp8 codec, {args.rows} rows of 64, best of {args.rounds} rounds")
    print(f"{'direction':<10}{'measure_codec ms':>18}{'own round trip ms':>19}{'ratio':>8}")
    for direction in ("fwd", "bwd"):
        m, o = min(measured[direction]) / 1e3, min(own[direction]) / 1e3
        print(f"{direction:<10}{m:>18.3f}{o:>19.3f}{m / o:>8.2f}")


if __name__ == "__main__":
    main()
