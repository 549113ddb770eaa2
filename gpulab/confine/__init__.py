"""What confines one submission while it is graded, from what Linux already has: the OS half of
``gpulab.course``'s sandbox step, kept apart so that the course package reads as the grading flow.

- ``isolation``: which layers this machine allows (``detect`` -> ``Plan``) and the command line
  that starts a submission inside them;
- ``nsinit``: PID 1 of the submission's namespaces (its private ``/tmp``, the masks, the orphans);
- ``cgroups``: the submission's cgroup (tasks and memory capped, frozen and killed whole);
- ``jail``: what the kernel process starts under (rlimits, Landlock, the audit hook);
- ``signal_targets``: whether a signal the kernel sends stays in its own tree.
- ``cuda_paths``: what of a GPU machine a kernel must reach (device files, CUDA's folders, variables).

Nothing here imports ``gpulab.course`` or torch: ``nsinit`` and ``jail`` start in every submission.
"""
