"""The operator's runtime: everything between kopf and the pure decisions (`rtj_operator.decide`).

- `handlers`: kopf wiring only (which events make which job reconcile).
- `queue`: the work queue (one pass per job at a time, bursts coalesced, failures retried).
- `job_pass`: one pass (observe, decide, write status, post Events, apply actions) and the finalizer.
- `context`: the operator's state handed to every handler (kopf's memo).
- `scrape`: reading the trainers' progress from their pods' progress endpoints (no API call).
- `kube`: every API call the operator makes, and the RBAC they need (`REQUIRED_PERMISSIONS`).
- `api_liveness`, `leader`: whether the operator still sees the API server; leader election.
- `quiet_logs`: one log line per failure class with a count, not one per retry.

The layers import downward only: handlers -> job_pass -> context -> queue, kube, scrape.
"""
