"""``nbgrader``'s command line, started without the one import that costs it seconds.

    python -m gpulab.course.nbgrader_main autograde 00_setup --student alice

The same as the ``nbgrader`` script, except for one thing. jsonschema (imported by nbformat) has
an optional checker for the ``iri`` format. That checker comes from ``rfc3987-syntax``, which
jupyter_server's ``jsonschema[format-nongpl]`` installs. It compiles an Earley grammar with lark
when jsonschema is imported: 1 to 2 s of every nbgrader start on a 2-core machine, more than
nbgrader's own imports. Grading starts one nbgrader per submission (:mod:`gpulab.course.sandbox`),
so the cost adds up over a class. No schema of nbformat, nbgrader or jupyter_server uses the
``iri`` format, so nothing is lost. Blocking the module makes jsonschema skip that checker, as
it does when the package is not installed.
"""

import sys

sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[assignment] - None makes the import fail


def main() -> None:
    from nbgrader.apps.nbgraderapp import main as nbgrader_main

    sys.argv[0] = "nbgrader"
    nbgrader_main()


if __name__ == "__main__":
    main()
