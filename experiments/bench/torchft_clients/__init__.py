"""torchft's own trainers (``DDP`` and ``DiLoCo``) on this project's workloads.

Clients of :mod:`experiments.bench.elastic_compare`: one process per host, each
a torchft replica group of one, writing the same metrics lines as an elastic
gossip host (``<run dir>/<replica id>/metrics.jsonl`` and ``summary.json``).
"""
