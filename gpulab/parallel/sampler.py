"""Moved to :mod:`gpulab.parallel.ddp.sampler`; this name stays so that lab notebooks saved earlier still import."""

import sys

from gpulab.parallel.ddp import sampler

sys.modules[__name__] = sampler
