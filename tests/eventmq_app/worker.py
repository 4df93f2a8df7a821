"""Run a real eventmq JobManager: python -m eventmq_app.worker BACKEND QUEUE CONCURRENT_JOBS."""

from __future__ import annotations

import sys

from eventmq.jobmanager import JobManager

if __name__ == "__main__":
    backend, queue, concurrent = sys.argv[1], sys.argv[2], int(sys.argv[3])
    JobManager(queues=[[10, queue]], concurrent_jobs=concurrent).jobmanager_main(broker_addr=backend)
