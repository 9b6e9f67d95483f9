"""Starting jobs: the local launcher (S PS shards + N workers as supervised processes) and what
torchrun or Slurm tell a worker through the environment.

Kept out of `netsense.cli` so that the benchmarks drive the same launcher as `netsense launch`.
"""

import sys

PYTHON: tuple[str, ...] = (sys.executable, "-P")
"""How every child runs Python: this interpreter without the working directory on ``sys.path``
(-P), so it imports the netsense its parent runs even when started in a folder that holds another
``netsense/`` (a second checkout: a benchmark's children ran that checkout's code)."""
