"""ftis-edge: collaborative GRPO post-training with F-TIS on consumer hardware."""
import os

__version__ = "0.1.0"

# llama.cpp and torch use OpenMP. With the default (active) wait policy, idle worker threads
# spin; on a machine where anything else is running (a second node, a game, the grader) the
# spinning threads fight for the cores and generation collapses: measured here 4.6 tok/s vs
# 151 tok/s with PASSIVE on 2 busy cores (benchmarks/bench_generate.py). Must be set before
# libgomp loads, i.e. before torch / llama_cpp are imported; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
