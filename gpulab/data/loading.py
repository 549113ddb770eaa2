"""The input pipeline toolkit of lab 02, in one import: tune the loader, move less, decode once, echo.

    from gpulab.data.loading import (LoaderConfig, make_loader, sweep_loader, tune_loader,
                                     to_device_normalize, InMemoryCache, BatchEcho)

Each fix from the source posts, and where it lives (:class:`gpulab.data.crossing.TransferLog` shows
what a pipeline really sends to the device: the dtypes that cross, and how many samples are repeats):

| fix | what it removes | module |
|---|---|---|
| ``num_workers`` (sweep, tune) | batches built one at a time in the main process | :mod:`gpulab.data.workers`, :mod:`gpulab.data.tuning` |
| ``persistent_workers`` | worker start-up at every epoch | :mod:`gpulab.data.workers` |
| ``prefetch_factor`` | steps stalled by an occasional slow batch (``StallingReads``) | :mod:`gpulab.data.workers` |
| ``pin_memory`` + ``non_blocking`` | a synchronous copy from pageable memory (GPU only) | :mod:`gpulab.data.workers` |
| uint8 transfer, normalise on device | 3/4 of the bytes over the link, CPU arithmetic | :mod:`gpulab.data.transfer` |
| ``InMemoryCache`` | decoding the same file every epoch | :mod:`gpulab.data.caching` |
| ``BatchEcho`` | idle device time, at the cost of less randomness | :mod:`gpulab.data.echo` |
"""

from gpulab.data.caching import InMemoryCache
from gpulab.data.echo import BatchEcho
from gpulab.data.transfer import normalize_on_host, to_device_normalize
from gpulab.data.tuning import SweepResult, TuneResult, sweep_loader, tune_loader
from gpulab.data.workers import LoaderConfig, LoaderWarning, make_loader, measure_loader

__all__ = [
    "LoaderConfig", "LoaderWarning", "make_loader", "measure_loader",
    "sweep_loader", "tune_loader", "SweepResult", "TuneResult",
    "to_device_normalize", "normalize_on_host", "InMemoryCache", "BatchEcho",
]
