"""Benchmarks and their figures: one module per `netsense bench` kind, plus the results schema and plots.

A kind module (`codecs`, `transport`, `scenario`, `shards`) defines ``register(kinds) -> None`` and
``run(args) -> int``; `netsense.cli.bench` registers every kind it finds. `results`, `plot` and
`plot_run` read only what a run left behind, so `netsense plot` redraws figures without rerunning.
"""
