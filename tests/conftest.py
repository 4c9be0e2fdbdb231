"""Shared fixtures: the embedded local cluster (or a real one through RTJ_TEST_KUBECONFIG)."""

pytest_plugins = ["rtj_localcluster.testing"]
