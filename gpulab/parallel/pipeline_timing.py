"""Moved to :mod:`gpulab.parallel.pipeline.timing`; this name stays so that lab notebooks saved earlier still import."""

import sys

from gpulab.parallel.pipeline import timing

sys.modules[__name__] = timing
