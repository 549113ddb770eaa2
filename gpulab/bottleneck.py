"""Moved to :mod:`gpulab.profiling.bottleneck`; this name stays so that lab notebooks saved earlier still import."""

import sys

from gpulab.profiling import bottleneck

sys.modules[__name__] = bottleneck
