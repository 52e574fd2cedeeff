"""The exit codes of ``python -m flaxzoo.train`` (every task), ``flaxzoo train`` and the launcher, for schedulers.

| outcome | code |
|---|---|
| finished: the last step was trained (or the work directory was already there) | :data:`FINISHED` 0 |
| a run failed during training (a non-finite loss, no usable checkpoint, any error after the first step) | :data:`FAILED` 1 |
| a bad config, command line or input, found before the first step: nothing was computed | :data:`BAD_INPUT` 2 |
| stopped by SIGTERM / SIGINT / preemption before the last step, after its checkpoint was saved: run it again | :data:`PREEMPTED` 75 |

75 is ``EX_TEMPFAIL`` of BSD's ``sysexits.h`` ("a temporary failure; the user is invited to retry"). It is not 0, so a
Kubernetes Job, a JobSet or SLURM does not count a preempted run as a success; a restart policy that retries on 75
(Kubernetes ``podFailurePolicy`` with ``onExitCodes: {operator: In, values: [75]}`` and ``action: Ignore``; SLURM
``scontrol requeue`` when the job's code is 75) resumes it from its checkpoint. ``docs/multi-host.md`` shows both.
"""

from __future__ import annotations

FINISHED = 0
FAILED = 1
BAD_INPUT = 2
PREEMPTED = 75
