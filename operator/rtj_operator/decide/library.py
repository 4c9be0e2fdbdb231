"""Whether a job's training uses the rtj library, and the SettingsIgnored condition that follows from it.

Some spec fields are honoured by the rtj library alone (`api.spec.LIBRARY_ONLY_FIELDS`: the checkpoint
cadence and retention, in-process restarts, ...); a training script of one's own, which rtj-launch runs
all the same, ignores them. The library says it is there: its reports carry `library`, its version,
which the fold keeps in `status.progress.library`. The library's own program, rtj-train (the default
command), uses it too, though its first report comes only with its first step.

`watch_settings`, once the workers' reports arrive: a job that uses the library is
`SettingsIgnored=False` (`LibraryInUse`); one that does not is `SettingsIgnored=True`
(`LibraryNotInUse`, one Warning Event `SettingsIgnored` when it turns True) listing the library-only
fields its spec sets to other than their defaults, or False (`NoLibrarySettings`) when it sets none.
A section turned off (`enabled: false`, such as `faultTolerance.inProcess` for a script of one's own)
asks for nothing and is not listed. The library reports first at its first step, which a large job
reaches minutes after its pods are Ready, so "no library" is concluded only once training is seen
without it: a step from the spec's log-line pattern, or every worker ready for
`spec.progress.stallAfterSeconds` (the time after which such a job would count as stalled) with no
library report; until then the condition stays as it was.

Pure: the pass state in, a condition and an Event out.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import PurePosixPath
from typing import Any

from rtj_operator import events
from rtj_operator.api.spec import ResilientTrainingJobSpec, library_only_fields_set
from rtj_operator.api.status import StepSource
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.state import PassState

# The rtj library's own training program (the spec's default command).
LIBRARY_PROGRAM = "rtj-train"


def runs_library_program(spec: ResilientTrainingJobSpec) -> bool:
    """Whether the job's command is the library's own program, rtj-train."""
    return PurePosixPath(spec.command[0]).name == LIBRARY_PROGRAM


def library_version(run: PassState) -> str | None:
    """The rtj library version the workers report (now or before), None when none did."""
    version = run.progress.library if run.progress is not None else None
    return version or None


def ignored_settings(spec: ResilientTrainingJobSpec) -> list[str]:
    """The library-only fields the spec sets to other than their defaults, but for sections turned off."""
    body = spec.model_dump(by_alias=True, mode="json")
    return [path for path in library_only_fields_set(spec) if not _turned_off(body, path)]


def _turned_off(body: Mapping[str, Any], path: str) -> bool:
    """Whether the field at `path`, or a section above it, says `enabled: false`."""
    value: Any = body
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, Mapping) and value.get("enabled") is False:
            return True
    return False


def watch_settings(run: PassState) -> None:
    """SettingsIgnored from this pass's reports (none: unchanged)."""
    if run.folded is None or not run.folded.reported:
        return
    spec = run.job.model.spec
    version = library_version(run)
    if version is not None or runs_library_program(spec):
        uses = f"the rtj library {version}" if version else f"{LIBRARY_PROGRAM}, the rtj library's program"
        message = f"the job uses {uses}"
        run.condition(cond.COND_SETTINGS_IGNORED, False, cond.REASON_LIBRARY_IN_USE, message)
        return
    if not _trains_without_library(run):
        return
    ignored = ignored_settings(spec)
    if not ignored:
        message = "the workers report no rtj library, and the spec sets no field only the library honours"
        run.condition(cond.COND_SETTINGS_IGNORED, False, cond.REASON_NO_LIBRARY_SETTINGS, message)
        return
    message = (
        f"the workers report no rtj library, so the training script ignores spec.{', spec.'.join(ignored)} "
        "(they apply to training scripts that use the rtj library, as rtj-train does)"
    )
    if run.condition(cond.COND_SETTINGS_IGNORED, True, cond.REASON_LIBRARY_NOT_IN_USE, message):
        run.event(events.WARNING, events.SETTINGS_IGNORED, message)  # once, when it turns True


def _trains_without_library(run: PassState) -> bool:
    """Whether training is seen without the library: a step from the log-line pattern, or every worker
    ready for stallAfterSeconds with no library report (until then, ask to look again then)."""
    sources = run.progress.sources if run.progress is not None else None
    if sources is not None and sources.step == StepSource.LOG_PATTERN:
        return True
    ready = cond.ready_since(run.conditions, run.now)
    if ready is None:
        return False
    deadline = ready + timedelta(seconds=run.job.model.spec.progress.stall_after_seconds)
    if run.now >= deadline:
        return True
    run.at(deadline)
    return False
