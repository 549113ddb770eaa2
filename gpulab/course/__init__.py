"""The nbgrader course workflow behind the make targets (docs/instructor.md), in the order a lab
goes through it:

- ``release`` (release, copy-work, check) and ``lab`` (``make lab``), ``validate`` and
  ``execution`` (the student's Validate), then ``collect`` (an LMS download into ``submitted/``);
- ``grade`` (the class in parallel, ``grades.csv``) runs ``reference`` (the expected values) and,
  per submission, ``sandbox`` (``integrity``, ``mask``, ``kernel``, and the OS layers of
  :mod:`gpulab.confine`) around ``execute`` (the cells run, the evidence taken) and ``judge`` (the
  verdicts); ``gradebook`` merges each result, ``similarity`` and ``notes`` write the notes;
- ``feedback`` renders the pages without hidden tests.

``notebooks/source/<lab>/`` holds the only hand-edited copy of each lab. This file imports
nothing.
"""
