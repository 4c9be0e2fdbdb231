"""How a container tells the operator why it ended: its exit status, and a line of its termination
message that names the fault's reason (docs/operations.md). rtj-launch, rtj-store and the library
write them; the operator reads them, and ``failurePolicy.rules[].onFaultReasons`` matches the reason.
"""

from __future__ import annotations

import re
from typing import Final

# A reason is a CamelCase word of at most 64 characters, as onFaultReasons lists them.
FAULT_REASON_NAME: Final = r"[A-Za-z][A-Za-z0-9]*"
FAULT_REASON_MAX_CHARS: Final = 64
# The termination message's line that names the reason; what went wrong follows on the next line.
FAULT_REASON_PREFIX: Final = "FaultReason: "
FAULT_REASON_LINE: Final = re.compile(rf"^{FAULT_REASON_PREFIX}({FAULT_REASON_NAME})\s*$", re.MULTILINE)

# The command cannot start as configured (a wrong script path, a missing module; a store pod that
# cannot serve): no restart brings it up. Exit status EX_CONFIG.
STARTUP_FAILED: Final = "StartupFailed"
STARTUP_FAILURE_EXIT_CODE: Final = 78
# A failure that recurs at the same step: restarting cannot get past it. NVRx 0.7's launchers exit
# with 93 (its DEFAULT_NO_RESTART_EXIT_CODE) when NVRx decides the job must not restart; rtj-launch
# uses the same status for its own verdict, so the operator reads either the same way.
DETERMINISTIC_FAILURE: Final = "DeterministicFailure"
NO_RESTART_EXIT_CODE: Final = 93
# A rank whose own pod is not draining but another's is (the drain protocol): a failure to
# ft_launcher, which restarts the node's workers into the next rendezvous (EX_TEMPFAIL); a pod that
# fails with it (under the Supervisor launcher) left for a peer's drain.
PEER_DRAINED_EXIT_CODE: Final = 75


def is_fault_reason(text: str) -> bool:
    """Whether `text` is a reason onFaultReasons can list."""
    return len(text) <= FAULT_REASON_MAX_CHARS and re.fullmatch(FAULT_REASON_NAME, text) is not None


def fault_message(reason: str, detail: str = "") -> str:
    """A termination message that names `reason`, then (on the next line) says what went wrong."""
    return f"{FAULT_REASON_PREFIX}{reason}\n{detail}" if detail else f"{FAULT_REASON_PREFIX}{reason}"


def fault_reason(message: str) -> str | None:
    """The reason a termination message names, or None."""
    found = FAULT_REASON_LINE.search(message)
    return found.group(1) if found else None
