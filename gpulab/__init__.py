"""gpulab: graded labs that teach you to keep the GPU busy in PyTorch training.

The package holds the instruments (monitor, profiler, memory meter), the reference
implementations the labs' hidden tests compare with, and the course tooling. Notebooks import
from here; they never define reusable code themselves.

    python -m gpulab doctor      # what this machine has and what will run where
"""

__version__ = "0.1.0"
