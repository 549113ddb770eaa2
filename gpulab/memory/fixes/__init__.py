"""Lab 08's references, together: the fix for each cause of an out-of-memory error, which the
lab's graders compare the student's exercises with (and mask while the lab is graded).

- :mod:`~gpulab.memory.fixes.loops`: a training epoch and an evaluation that keep memory flat and
  never wait for the device inside the loop (exercises 1-2);
- :mod:`~gpulab.memory.fixes.retry`: a step that splits its batch through out-of-memory errors and
  still takes the unsplit step (exercise 3);
- :mod:`~gpulab.memory.fixes.savings`: bf16 autocast and activation checkpointing, and
  :func:`~gpulab.memory.fixes.savings.peak_memory` that measures what they save (exercise 4).

The tools that find the cause (``LeakFinder``, ``memory_report``, ``summary``) sit one level up.
"""
