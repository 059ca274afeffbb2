"""Benchmarks of the checkpoint path against the physical limit: one raw write + fsync.

Run ``python -m benchmarks`` from the repository root (``--quick`` for a smoke run, ``--json``
for one JSON object with every figure, ``--svg PATH`` for the chart). Results and method are in
``docs/benchmarks.md``. This package is not part of the distribution.
"""
