"""NVRx's in-process restart, deprecated since NVRx 0.6, is reached through one module
(`rtj_trainer.library.nvrx_inprocess`), and a release without it leaves a job a way to run: the
fallback the module documents, shown here with the layer made unimportable as a release that removed
it would leave it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import rtj_trainer

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("trainer_image", "operator", "demo", "localcluster", "bench")
THE_MODULE = REPO / "trainer_image" / "rtj_trainer" / "library" / "nvrx_inprocess.py"
LAYER = "nvidia_resiliency_ext.inprocess"


def imports_the_layer(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            a.name == LAYER or a.name.startswith(LAYER + ".") for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == LAYER or node.module.startswith(LAYER + "."):
                return True
            if node.module == "nvidia_resiliency_ext" and any(a.name == "inprocess" for a in node.names):
                return True
    return False


def test_only_one_module_imports_the_deprecated_in_process_layer() -> None:
    importers = sorted(
        str(path.relative_to(REPO))
        for folder in SOURCES
        for path in (REPO / folder).rglob("*.py")
        if ".venv" not in path.parts and imports_the_layer(ast.parse(path.read_text(encoding="utf-8")))
    )
    assert importers == [str(THE_MODULE.relative_to(REPO))]
    # The check sees each form of the import.
    for source in (
        "from nvidia_resiliency_ext import inprocess",
        "import nvidia_resiliency_ext.inprocess.wrap",
        "from nvidia_resiliency_ext.inprocess.state import Mode",
    ):
        assert imports_the_layer(ast.parse(source)), source
    assert not imports_the_layer(ast.parse("from nvidia_resiliency_ext import fault_tolerance"))


def test_the_installed_releases_have_the_layer() -> None:
    assert rtj_trainer.in_process_available()
    assert rtj_trainer.in_process_layer().__name__ == LAYER


# Run in a fresh interpreter where importing the layer fails, as it would on a release without it.
WITHOUT_THE_LAYER = """
import json, sys
sys.modules["nvidia_resiliency_ext.inprocess"] = None
import rtj_trainer
from rtj_trainer.reference import train

seen = {"available": rtj_trainer.in_process_available()}
once = rtj_trainer.wrap_in_process(lambda cw: "ran once" if cw is None else "wrapped", enabled=False)
seen["disabled"] = once()
try:
    rtj_trainer.wrap_in_process(lambda cw: 0)
except rtj_trainer.InProcessUnavailableError as error:
    seen["enabled"] = str(error)
try:
    import rtj_trainer.reference.restart
except rtj_trainer.InProcessUnavailableError as error:
    seen["restart"] = type(error).__name__

class Trainer:
    def run(self, call_wrapper):
        return "trained without the wrapper" if call_wrapper is None else "wrapped"

off = rtj_trainer.JobSettings.from_environ({"RTJ_INPROCESS_ENABLED": "false"})
seen["rtj-train off"] = train.training_entry(Trainer(), off)()
try:
    train.training_entry(Trainer(), rtj_trainer.JobSettings.from_environ({}))
except rtj_trainer.InProcessUnavailableError as error:
    seen["rtj-train on"] = type(error).__name__
print(json.dumps(seen))
"""


def test_without_the_layer_a_job_with_in_process_restart_off_runs_and_one_with_it_on_is_told_why() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_LAYER],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ | {"PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["available"] is False
    # In-process restart off: the function runs once, without the wrapper, in a script and in rtj-train.
    assert seen["disabled"] == "ran once"
    assert seen["rtj-train off"] == "trained without the wrapper"
    # On: stopped at the start, with the way out named.
    assert "has no in-process restart" in seen["enabled"] and "deprecated since 0.6.0" in seen["enabled"]
    assert "inProcess.enabled: false" in seen["enabled"] and "launcher: FtLauncher" in seen["enabled"]
    assert seen["restart"] == seen["rtj-train on"] == "InProcessUnavailableError"
