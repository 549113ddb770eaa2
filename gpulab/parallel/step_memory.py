"""Moved to :mod:`gpulab.parallel.dp.step_memory`; this name stays so that lab notebooks saved earlier still import."""

import sys

from gpulab.parallel.dp import step_memory

sys.modules[__name__] = step_memory
