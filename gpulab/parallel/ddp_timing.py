"""Moved to :mod:`gpulab.parallel.ddp.timing`; this name stays so that lab notebooks saved earlier still import."""

import sys

from gpulab.parallel.ddp import timing

sys.modules[__name__] = timing
