"""The operator's decisions: `reconcile(job, observed, now) -> Plan`, pure, one module per policy.

`rtj_operator.runtime.job_pass` builds a `JobView` and an `Observed` (see `rtj_operator.observe`),
calls `reconcile`, writes `Plan.status` first and applies `Plan.actions` after. Nothing here does I/O.

Writing status before acting is what makes the counters exact across operator crashes. Each worker
and spare (and each surge pod wanted: `surges`) has an entry in `status.workers.pods` whose `state`
(`api.EntryState`) is the operator's record of it:

- `Creating`: a pod is wanted and none of the job's has been seen on a node yet; `nodeName`, if set,
  is the node the pod is pinned to (a hot spare's or a surge pod's node).
- `Pending` / `Running` / `Succeeded` / `Failed`: the pod was seen in that phase on `nodeName`.
- `Replacing`: a fault was counted; the old pod is to be removed and a new one created.
- `Suspended`: the job is suspended; no pod is wanted.

A fault is counted only when an entry in `Pending`/`Running` on a node meets a lost, failed or
disrupted pod, and the same status write moves the entry to `Replacing`. A crash after that write
but before the deletes/creates resumes from `Replacing` without counting again; a crash before it
recounts nothing because nothing was written. Pod names are deterministic and creates treat
AlreadyExists as success, so a retried plan never duplicates a pod.

The modules, in reading order:

- `reconciler`: `reconcile()`, the pass as an ordered script of the policies below.
- `actions`: what a decision asks for (`CreateObject`, `DeletePod`, ...), `Event`, `Plan`.
- `state`: the typed pass state (`PassState`) and the status records it rewrites.
- `failures`: lost workers, fault counting and budgets, node faults and exclusion.
- `startup`: a worker whose training command cannot start fails the job at once (`StartupFailed`).
- `repeated`: a worker whose training fails the same way at the same step fails the job at once
  (`DeterministicFailure`).
- `placement`: workers and spares toward running pods; hot spares used for replacements.
- `surges`: a surge pod per worker terminating gracefully (a drain) without a spare to take its
  place, asking for its replacement's node while the old pod checkpoints.
- `lifecycle`: running, suspended, resumed, finished, TTL, invalid specs, deletion.
- `filesystems`: no create for a job whose FSx file system is not allowed for its namespace.
- `admission`: children the API server refused; creates held until the spec changes or a recheck.
- `capacity`: whether enough nodes could ever hold a worker; no pod is created until they do.
- `training`: whether training advances: `Stalled` (`Unknown` while no step is reported), and a
  recovery that ends with the first step (or, without steps, with every worker's ranks running).
- `library`: whether the training uses the rtj library; `SettingsIgnored` lists what it ignores if not.
- `checkpoint_advice`: the checkpoint interval the measured save cost and fault rate advise.
- `conditions`: conditions and the state derived from them.
- `milestones`: the once-per-job Events, posted under names of their own and re-posted after a
  restart when status says they are due (an Event a crash lost comes back).
"""

from rtj_operator.decide.actions import (
    Action,
    CreateObject,
    DeleteJob,
    DeleteObject,
    DeletePod,
    Event,
    Plan,
    TaintNode,
)
from rtj_operator.decide.admission import (
    PERMANENT_CODES,
    REFUSAL_RECHECK_SECONDS,
    Refusal,
    record_refusal,
)
from rtj_operator.decide.conditions import set_condition
from rtj_operator.decide.lifecycle import comparable, finalize, reconcile_invalid
from rtj_operator.decide.reconciler import reconcile
from rtj_operator.decide.surges import surge_refused

__all__ = [
    "PERMANENT_CODES",
    "REFUSAL_RECHECK_SECONDS",
    "Action",
    "CreateObject",
    "DeleteJob",
    "DeleteObject",
    "DeletePod",
    "Event",
    "Plan",
    "Refusal",
    "TaintNode",
    "comparable",
    "finalize",
    "reconcile",
    "reconcile_invalid",
    "record_refusal",
    "set_condition",
    "surge_refused",
]
