"""pytest fixtures for tests that need a Kubernetes API: the embedded local cluster by default."""
