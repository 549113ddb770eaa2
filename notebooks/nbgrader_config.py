"""nbgrader configuration for the gpulab course (this folder is the course root).

Run nbgrader from this folder, with .venv/bin on PATH (nbgrader calls `alembic` from PATH);
`make release`, `make grade` and `make feedback` do both for you.
"""

import os

c = get_config()  # noqa: F821 - provided by nbgrader

c.CourseDirectory.course_id = "gpulab"
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
# Files that are not part of a lab: never copied into release/ or collected.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.h5", "*.h5.tmp*"]

# Late submissions, the one place to set their penalty: a submission after the lab's due date (set with
# `make hub-release LAB=... DUE="2026-10-01 17:00:00 UTC"`, or in the formgrader) scores 0. nbgrader's
# default, "none", only records how late it was; a subclass of nbgrader's LateSubmissionPlugin set as
# c.AssignLatePenalties.plugin_class gives any other rule. make grade applies it as nbgrader autograde does.
c.LateSubmissionPlugin.penalty_method = "zero"

# Prepended to every released notebook: how to work and how grading works.
c.IncludeHeaderFooter.header = "source/header.ipynb"

# What replaces a solution in the student's copy.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# The per-cell execution limit, the same for Validate in the student's JupyterLab, `make check`
# and `make grade` (gpulab/autograde/execute/config.py; `make lab` writes the student's config with it).
from gpulab.autograde.execute.config import configure  # noqa: E402

configure(c)

# Feedback is built from what the student handed in: their cells and the outputs of their own run, the
# test cells as released (the visible part only), and the grader's verdicts; never from what the graded
# kernel showed, which ran the hidden tests (gpulab/course/feedback_page.py). GetGrades then reads each
# cell's score from the gradebook; formgrader's "generate feedback" builds the same page as `make feedback`.
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor  # noqa: E402
from nbgrader.preprocessors import GetGrades  # noqa: E402

from gpulab.course.feedback_page import FromSubmission  # noqa: E402

c.GenerateFeedback.preprocessors = [FromSubmission, GetGrades, CSSHTMLHeaderPreprocessor]
