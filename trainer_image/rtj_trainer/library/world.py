"""Supervisor mode's contract between the pod runtime and the ranks: two store keys and an exit status
(the stores' ports are rtj_contract.stores').

In supervisor mode (docs/trainer.md, "Supervisor mode") the ranks of one fixed world and the pods'
``rtj-launch`` (``rtj_trainer.runtime.supervisor``) talk through the job's store pod
(``rtj_trainer.runtime.store``) and through the ranks' exit statuses. The training side
(``rtj_trainer.reference.train``) sets the keys and exits with the status; the supervisor reads
them. Both sides import these names from here, so neither imports the other; the facade re-exports
them (``rtj_trainer.WORLD_FORMED_KEY``, ...: docs/library.md) for a script that runs under the
Supervisor launcher as ``rtj-train`` does. Standard library only: ``rtj-launch`` imports this without
torch.
"""

from __future__ import annotations

from typing import Final

# Key a rank sets once the world has formed: a replacement pod that finds it stands by.
WORLD_FORMED_KEY: Final = "rtj/world-formed"
# Key rank 0 sets once the final checkpoint committed: a standing-by pod then ends with success.
WORLD_FINISHED_KEY: Final = "rtj/world-finished"
# A rank's exit status when the in-process world cannot go on (no reserve rank left, a shrunk
# world): the pod then exits with it and the operator restarts the job.
WORLD_BROKEN_EXIT_CODE: Final = 3
