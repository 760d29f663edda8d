"""Bytes per step and in-flight payload memory of compressed gossip, per built-in topology.

From the library's own cost model (:func:`decent_dp.compression.exchange_bytes`
and :func:`~decent_dp.compression.inflight_bytes`), which the tests check
against what the collectives move. One 25 MB float32 bucket; the busiest rank
of each topology.

Example::

    python -m experiments.bench.compression_bytes --world-sizes 8 32 > docs/results/compression/bytes.md
"""

from __future__ import annotations

import argparse

from decent_dp.compression import bytes_per_step, inflight_bytes, parse_compression
from decent_dp.topo import TopologyReg
from experiments.report.doc_data import md_table

NUMEL = 25 * 2**20 // 4
COMPRESSIONS = ("none", "bf16", "int8", "randk:0.1")


def rows(world_size: int) -> list[list[str]]:
    """One table row per topology: MB per step for each compressor, and the ratios."""
    out = []
    for name in TopologyReg.names():
        topo = TopologyReg.create(name, world_size, 1)
        per_rank = []
        for rank in range(world_size):
            edges = [topo.get_edge(r, rank) for r in range(topo.period)]
            sent = [bytes_per_step(parse_compression(c), edges, [NUMEL], 4) for c in COMPRESSIONS]
            k = max(len(e.ranks) for e in edges)
            held = inflight_bytes(parse_compression("int8"), NUMEL, 4, k)
            per_rank.append((sent, k, held))
        sent, k, held = max(per_rank, key=lambda r: r[0][0])
        mb = [f"{b / 1e6:.2f}" for b in sent]
        ratio = [f"{b / sent[0]:.3f}" if sent[0] else "–" for b in sent[1:3]]
        out.append([name, str(world_size), str(k), *mb, *ratio, f"{held / 1e6:.1f}"])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 32])
    args = parser.parse_args(argv)
    print("# Compressed gossip: bytes and in-flight memory per topology\n")
    print(
        "Written by `python -m experiments.bench.compression_bytes`: the library's cost model, "
        "one 25 MB float32 bucket, the busiest rank. Groups of more than two exchange in two "
        "phases (compressed chunks to their owners, the owners' compressed sums to all), so "
        "the ratio to exact gossip is the compressor's on every topology. In-flight: the "
        "int8 payload buffers one bucket's exchange holds (one member's payload is 6.6 MB).\n"
    )
    header = ["topology", "n", "largest group", "none MB/step", *COMPRESSIONS[1:]]
    header += ["bf16/none", "int8/none", "int8 in flight MB"]
    cells = [row for n in args.world_sizes for row in rows(n)]
    print(md_table(header, ["---", *["---:"] * (len(header) - 1)], cells))


if __name__ == "__main__":
    main()
