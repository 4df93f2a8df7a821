"""Jobs and a worker entry point for the tests that run the real eventmq client and JobManager."""
