"""The machine's accounts and the course's closed files, below both the hub and the grader.

- :mod:`gpulab.accounts.users`   the local accounts a roster names (created only when asked, rolled back on failure);
- :mod:`gpulab.accounts.private` the course's private part, closed to every student account by its modes.
- :mod:`gpulab.accounts.students` a student id as the grader and a spreadsheet may use it.

``make grade`` (gpulab.autograde) and the hub's loop (gpulab.hub) both close what they wrote; the
package sits below the two so that neither imports the other's way back.
"""
