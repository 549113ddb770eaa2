"""Moved to :mod:`gpulab.parallel.ddp.examples`; this name stays so that lab notebooks saved earlier still import."""

import sys

from gpulab.parallel.ddp import examples

sys.modules[__name__] = examples
