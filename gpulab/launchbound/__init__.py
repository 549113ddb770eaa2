"""The launch-bound step (lab 12): how much of the device's arithmetic a step uses, and why not more.

- :mod:`~gpulab.launchbound.flops`: FLOPs of a step, counted by ``FlopCounterMode`` and analytically;
- :mod:`~gpulab.launchbound.mfu`: the device's peak measured by a large matmul, the datasheet figure
  beside it, and MFU (achieved FLOP/s over peak);
- :mod:`~gpulab.launchbound.overhead`: time per op against op size, and the size below which the fixed
  cost per op (the dispatcher on a CPU, the launch on a GPU) decides the step's time;
- :mod:`~gpulab.launchbound.bound`: overhead-, memory- or compute-bound, from those measurements;
- :mod:`~gpulab.launchbound.roofline`: arithmetic intensity against the machine's balance point;
- :mod:`~gpulab.launchbound.fusion`: an elementwise-heavy block with a graph break, and what
  torch.compile makes of it (ops before and after, the generated code);
- the simulated launch cost and CUDA-graph replay are in :mod:`gpulab.accel.launches`.

Run the figures of this package: ``python benchmarks/launch_bound.py``.
"""
