"""e2e: pod-spec and fault suites against real kind labs, and fault-injection experiments."""
