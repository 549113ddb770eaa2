"""Moved to :mod:`gpulab.parallel.ddp.amp`; this name stays so that lab notebooks saved earlier still import."""

import sys

from gpulab.parallel.ddp import amp

sys.modules[__name__] = amp
