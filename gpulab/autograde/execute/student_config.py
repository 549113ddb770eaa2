# gpulab: the course's execution limits for Validate and `make check` (gpulab/autograde/execute/config.py);
# make lab and make hub put this file into the student's Jupyter config folder.
from gpulab.autograde.execute.config import configure

configure(get_config())  # noqa: F821 - provided by nbgrader
