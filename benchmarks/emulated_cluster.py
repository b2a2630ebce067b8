"""An emulated multi-node cluster on one machine: network namespaces joined by shaped veths.

Each "node" is a network namespace. Node 0 is joined to every other node by a veth pair whose
two ends are shaped with `tbf` (the one shaping qdisc this kernel has; see the field notes), so
traffic between nodes crosses a slow link while ranks inside one node talk over loopback.

The link is paced like a wire: tbf's `peakrate` (a hair above `rate`) with a 64 KB second
bucket. A plain tbf lets a message of up to `burst` bytes leave at veth speed once the bucket
has refilled, which no inter-node link does. At 1 Gbit/s with the 256 KB burst, gloo
all-to-alls of 320 KB and 640 KB (half of each crosses the link) took 0.51 and 1.45 ms, 2.5x
and 1.8x faster than the line allows, and 1.24 MB took 6.25 ms (0.8x). In the trainer, one
exchange sent as four micro-batch chunks took 0.64-0.74x its time unsplit: the "gain" of a
token bucket, not of overlap. Paced, time grows with the bytes from the first packet
(docs/whatif.md).

A job is started as one `torchrun --nnodes N --node-rank i` per namespace, with
GLOO_SOCKET_IFNAME set to the node's veth and the namespace's name as its hostname (a UTS
namespace each: with one shared hostname, recprof read both nodes' ranks as one host's, with
no core to spare and no inter-node link). Everything is removed on exit (namespaces, and the
veths inside them with them), also after an error or Ctrl-C.

    python benchmarks/emulated_cluster.py --nodes 2 --nproc-per-node 1 --rate 1gbit -- \\
        -m recprof.nestpipe --config examples/configs/demo.yaml

Needs root (CAP_NET_ADMIN) and `ip`/`tc`; `EmulatedCluster.available()` says why not.
Only two nodes are supported for now (one link); more would need a bridge.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parent.parent


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


#: tbf's second bucket when paced: one veth segment (TSO sends up to 64 KB at once; a smaller
#: bucket would drop those).
PEAK_BUCKET = "65536"
#: tc's rate units, in bits per second (a bare number is bits, `bps` is bytes: man tc).
_UNITS = {"": 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
          "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9, "tbps": 8 * 10**12}


def _just_above(rate: str) -> str:
    """tbf's peakrate for a link paced at `rate`: tbf needs peakrate > rate, so 0.1% above."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", rate.strip().lower())
    if match is None or match[2] not in _UNITS or float(match[1]) <= 0:
        raise ValueError(f"link rate {rate!r}: give a positive number and one of tc's units "
                         f"({', '.join(u for u in _UNITS if u)})")
    return f"{round(float(match[1]) * _UNITS[match[2]] * 1.001)}bit"


def link_rate(text: str) -> str:
    """argparse type of a link rate: tc's syntax, refused with the reason at parse time (before
    any folder or namespace is made)."""
    try:
        _just_above(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@dataclass
class Node:
    namespace: str
    ifname: str
    address: str


class EmulatedCluster:
    """Context manager: two namespaces, one tbf-shaped veth link between them, paced like a
    wire unless `paced=False` (see the module docstring)."""

    def __init__(self, rate: str = "1gbit", burst: str = "256kb", latency: str = "100ms",
                 paced: bool = True) -> None:
        tag = f"{os.getpid() % 100000}"
        self.nodes = [
            Node(f"recprof{tag}n{i}", f"rpveth{i}", f"10.231.{os.getpid() % 250}.{i + 1}")
            for i in range(2)
        ]
        self.rate, self.burst, self.latency = rate, burst, latency
        self.pacing = ["peakrate", _just_above(rate), "mtu", PEAK_BUCKET] if paced else []

    @staticmethod
    def available() -> str | None:
        """None when namespaces can be made here, else the reason they cannot."""
        if os.geteuid() != 0:
            return "needs root for network namespaces"
        probe = f"recprofprobe{os.getpid()}"
        try:
            _ip("netns", "add", probe)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            return f"cannot create a network namespace: {detail.strip()}"
        _ip("netns", "del", probe)
        return None

    def __enter__(self) -> EmulatedCluster:
        # SIGTERM (and SIGINT, which background jobs ignore) must still tear down: turn it
        # into SystemExit so __exit__ runs.
        self._previous = signal.signal(signal.SIGTERM, _exit_on_signal)
        try:
            for node in self.nodes:
                _ip("netns", "add", node.namespace)
                _ip("-n", node.namespace, "link", "set", "lo", "up")
            a, b = self.nodes
            _ip("link", "add", a.ifname, "netns", a.namespace, "type", "veth",
                "peer", "name", b.ifname, "netns", b.namespace)
            for node in self.nodes:
                _ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", node.ifname)
                _ip("-n", node.namespace, "link", "set", node.ifname, "up")
                subprocess.run(
                    ["ip", "netns", "exec", node.namespace, "tc", "qdisc", "add", "dev",
                     node.ifname, "root", "tbf", "rate", self.rate, "burst", self.burst,
                     "latency", self.latency, *self.pacing],
                    check=True, capture_output=True, text=True,
                )
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.teardown()
        signal.signal(signal.SIGTERM, self._previous)

    def teardown(self) -> None:
        """Stop anything still running in our namespaces, then delete them (and their veths)."""
        for node in self.nodes:
            pids = subprocess.run(["ip", "netns", "pids", node.namespace],
                                  capture_output=True, text=True).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", node.namespace], capture_output=True)

    def leftovers(self) -> list[str]:
        """Our namespaces that still exist (empty after teardown)."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        names = {line.split()[0] for line in listed.splitlines() if line.strip()}
        return [n.namespace for n in self.nodes if n.namespace in names]

    def torchrun(
        self, nproc_per_node: int, target: Sequence[str], port: int = 29531,
        wrapper: Sequence[Sequence[str]] | None = None, timeout: float = 600,
    ) -> list[subprocess.CompletedProcess]:
        """Run one torchrun per node (static rendezvous on node 0) and wait for all of them.

        `target` is what follows torchrun's own flags (`-m pkg ...` or `script.py ...`).
        `wrapper[i]` is put in front of node i's torchrun (for example `recprof capture
        --out DIR --`). Returns each node's completed process (stdout/stderr captured).
        """
        # The ranks share this machine's cores; without a cap each would start one intra-op
        # thread per core and they would all contend (torchrun only caps it when nproc > 1).
        threads = max(1, (os.cpu_count() or 1) // (len(self.nodes) * nproc_per_node))
        procs = []
        for rank, node in enumerate(self.nodes):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(self.nodes)),
                   "--node-rank", str(rank), "--nproc-per-node", str(nproc_per_node),
                   "--master-addr", self.nodes[0].address, "--master-port", str(port), *target]
            if wrapper is not None:
                cmd = [*wrapper[rank], *cmd]
            env = {"OMP_NUM_THREADS": str(threads), **os.environ,
                   "GLOO_SOCKET_IFNAME": node.ifname}
            # Each node under its own hostname (a UTS namespace), as on a real cluster: the
            # traces and step logs then tell the nodes apart, as recprof reads them.
            own_host = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                        node.namespace]
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", node.namespace, *own_host, *cmd], env=env, cwd=REPO,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            ))
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--rate", type=link_rate, default="1gbit",
                        help="tbf rate of the inter-node link")
    parser.add_argument("--token-bucket", action="store_true",
                        help="plain tbf: messages up to its 256 KB burst leave at veth speed "
                             "(the link before pacing; see the module docstring)")
    parser.add_argument("target", nargs=argparse.REMAINDER,
                        help="after --: what torchrun runs (-m module ... or script.py ...)")
    args = parser.parse_args()
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    reason = EmulatedCluster.available()
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    with EmulatedCluster(rate=args.rate, paced=not args.token_bucket) as cluster:
        results = cluster.torchrun(args.nproc_per_node, target)
    for rank, res in enumerate(results):
        print(f"--- node {rank} ({cluster.nodes[rank].namespace}): exit {res.returncode}")
        print(res.stdout[-2000:], res.stderr[-2000:] if res.returncode else "", sep="")
    return max(r.returncode for r in results)


if __name__ == "__main__":
    sys.exit(main())
