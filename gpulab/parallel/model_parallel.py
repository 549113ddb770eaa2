"""Moved to :mod:`gpulab.parallel.pipeline.split`; this name stays so that lab notebooks saved earlier still import."""

import sys

from gpulab.parallel.pipeline import split

sys.modules[__name__] = split
