"""Entry point for ``python -m gpulab``; see :mod:`gpulab.cli`."""

import sys

from gpulab.cli import main

sys.exit(main())
