"""gpulab: graded labs that teach you to keep the GPU busy in PyTorch training.

The package holds the instruments (monitor, profiler, memory meter), the reference
implementations the labs' hidden tests compare with, and the course tooling. Notebooks import
from here; they never define reusable code themselves.

    python -m gpulab doctor      # what this machine has and what will run where
"""

import os

__version__ = "0.1.0"

# torch.profiler's C++ half (kineto) logs "USDT: ... profiler_start" to stderr on every profile, and
# nbgrader scores a test cell that wrote to stderr 0, whoever wrote it. Its levels put these lines
# above its errors, so only 6 silences them; read before the first profile of the process, so
# importing gpulab first is enough. Set KINETO_LOG_LEVEL=3 yourself to see kineto's warnings again.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")


class MaskedReference(RuntimeError):
    """Raised by one of gpulab's reference implementations while a lab that asks for it is graded:
    the exercise is to write it yourself (:mod:`gpulab.autograde.box.mask`)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"gpulab's reference {name} is not available while this lab is graded: the exercise is "
                         "to write it yourself (use torch, not gpulab's version)")
        self.name = name

if os.environ.get("GPULAB_LANG"):  # make lab LANG=ko: the demo cells' printed text in the student's language
    from gpulab.i18n import output as _output

    _output.install(os.environ["GPULAB_LANG"])
