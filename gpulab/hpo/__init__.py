"""Hyperparameter search that keeps the hardware busy (lab 10): Ray Tune's pieces, and ours.

- :mod:`gpulab.hpo.session`: start Ray (``ray.init(num_cpus=..., include_dashboard=False)``)
  and always shut it down, leaving no raylet, GCS or worker behind (:func:`ray_session`).
- :mod:`gpulab.hpo.trainable`: the trial every search runs: a small MLP on synthetic images,
  reporting accuracy and a checkpoint each epoch (:func:`train_classifier`).
- :mod:`gpulab.hpo.halving`: successive halving, the promotion rule inside ASHA, written out
  (:func:`successive_halving`), and a replay of it on finished learning curves.
- :mod:`gpulab.hpo.asha`: ASHA as an asynchronous Tune scheduler that promotes a trial when its
  result arrives (:class:`~gpulab.hpo.asha.PromotionASHA`; imports Ray, so it is not imported here),
  and :mod:`gpulab.hpo.replay`: any Tune scheduler replayed on finished curves, arrivals simulated.
- :mod:`gpulab.hpo.packing`: fractional resources that pack several trials onto one device.
- :mod:`gpulab.hpo.resources`: the request each search of the lab gives Ray (one GPU per trial
  on a GPU machine, a share when packed), and a check of the GPUs each trial really saw.
- :mod:`gpulab.hpo.results` and :mod:`gpulab.hpo.plots`: a ``ResultGrid`` as trial-epochs,
  best accuracy, trials per hour, and as plots.
- :mod:`gpulab.hpo.timing`: ``TrialTimer``, a Tune callback for steady-state throughput, and the
  utilisation monitor's mean over the same window (imports Ray, so it is not imported here).

Importing this package does not import Ray; the session and the trainable import it when used.
"""

from gpulab.hpo.halving import HalvingReplay, asha_continues, replay_halving, rung_milestones, successive_halving
from gpulab.hpo.packing import packed_resources
from gpulab.hpo.replay import replay_scheduler
from gpulab.hpo.resources import (
    SEARCHES,
    check_trial_devices,
    one_per_device,
    packing_factor,
    search_resources,
    visible_devices,
)
from gpulab.hpo.results import (
    SearchSummary,
    best_so_far,
    learning_curves,
    summarize,
    trial_configs,
    trial_epochs,
    trial_errors,
)
from gpulab.hpo.session import RaySession, ray_processes, ray_session
from gpulab.hpo.trainable import DEFAULTS, TrialCrash, make_data, run_trial, train_classifier

__all__ = ["ray_session", "RaySession", "ray_processes", "train_classifier", "run_trial", "make_data", "DEFAULTS",
           "TrialCrash", "successive_halving", "asha_continues", "replay_halving", "rung_milestones", "HalvingReplay",
           "learning_curves", "trial_epochs", "trial_configs", "trial_errors", "best_so_far", "summarize",
           "SearchSummary", "packed_resources", "search_resources", "one_per_device", "packing_factor", "SEARCHES",
           "visible_devices", "check_trial_devices", "replay_scheduler"]
