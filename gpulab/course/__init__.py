"""The nbgrader course workflow behind the make targets: release, copy-work, check, collect, grade,
feedback (see docs/instructor.md).

Grading at scale: ``grade`` (parallel orchestration, grades.csv) runs ``sandbox`` (one submission
in an isolated course copy) with ``integrity`` (checks against the gradebook), ``isolation``
(namespaces, cgroup, the kernel's uid), ``execute`` and ``jail`` (the kernel's limits), then
``gradebook`` merges the result; ``feedback`` keeps hidden tests out of the HTML; ``collect``
wraps zip_collect. ``release`` holds release, copy-work and check; ``nbgrader_cli`` runs
nbgrader's command line.

``notebooks/`` is the nbgrader course root. ``notebooks/source/<lab>/`` holds the only
hand-edited copy of each lab; everything else there is generated. A student's own copies live in
``work/`` and are never overwritten.

This package file imports nothing: every sandboxed submission starts small processes from here
(``nsinit``, ``jail`` twice), and each would otherwise pay for the whole workflow's imports.
"""
