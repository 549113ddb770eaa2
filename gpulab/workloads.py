"""Moved to :mod:`gpulab.profiling.workloads`; this name stays so that lab notebooks saved earlier still import."""

import sys

from gpulab.profiling import workloads

sys.modules[__name__] = workloads
