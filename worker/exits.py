"""How a worker process ends, as its supervisor reads the exit status (``worker/supervisor.py``).

Each status says what the exit tells about the worker's GPUs: a crash (a signal, an abort,
an unknown status) may be the GPU's fault and counts toward marking it unhealthy; the
statuses below are the worker saying it was not (sysexits.h's numbers, so they read the
same in a service manager's log).
"""

from __future__ import annotations

EXIT_DEFECT = 70  # EX_SOFTWARE: something in the worker raised where nothing handles it
EXIT_OUTAGE = 75  # EX_TEMPFAIL: the worker could not reach Redis or the database; try again later
EXIT_DEVICE_UNUSABLE = 78  # EX_CONFIG: it refused to run on its GPUs (and marked them unhealthy)
