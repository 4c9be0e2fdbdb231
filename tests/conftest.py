"""Shared fixtures: the embedded local cluster (or a real one through RTJ_TEST_KUBECONFIG)."""

# Imported now, at a shallow stack and before any test runs: hypothesis' pytest plugin imports the
# package at the end of a session that did not use it, and CPython 3.11's AST constructor can then
# fail with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905) when a
# test left threads behind, making a run of a file without hypothesis tests exit 1 after they passed.
import hypothesis  # noqa: F401

pytest_plugins = ["rtj_localcluster.testing", "pytester"]
