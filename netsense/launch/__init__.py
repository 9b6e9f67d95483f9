"""Starting jobs: the local launcher (S PS shards + N workers as supervised processes) and what
torchrun or Slurm tell a worker through the environment.

Kept out of `netsense.cli` so that the benchmarks drive the same launcher as `netsense launch`.
"""
