"""Python workloads the checks run in their own processes (under the limiter's environment)."""
