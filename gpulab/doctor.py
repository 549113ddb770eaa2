"""Moved to :mod:`gpulab.devices.doctor`; this name stays so that lab notebooks saved earlier still import."""

import sys

from gpulab.devices import doctor

sys.modules[__name__] = doctor
