"""The images' Dockerfiles pass hadolint and keep the conventions the chart relies on.

No Docker engine is available to build them here, so these tests read the Dockerfiles: hadolint
for the ecosystem's rules, and a small parser for what the chart and the operator assume (a
numeric non-root user, an exec-form entrypoint, pinned base images, verified downloads).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib

import pytest
from chart_support import HADOLINT, REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

DOCKERFILES = {
    "operator": REPO / "Dockerfile",
    "trainer": REPO / "trainer_image" / "Dockerfile",
    "runtime": REPO / "trainer_image" / "Dockerfile.runtime",
}
ENTRYPOINTS = {"operator": ["rtj-operator"], "trainer": ["rtj-launch"], "runtime": ["rtj-launch"]}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n(\s*#.*\n)*", " ", text)
    result = []
    for line in joined.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def final_stage(text: str) -> list[tuple[str, str]]:
    parsed = instructions(text)
    last_from = max(i for i, (keyword, _) in enumerate(parsed) if keyword == "FROM")
    return parsed[last_from:]


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_hadolint_reports_nothing(image: str) -> None:
    result = subprocess.run(
        [str(HADOLINT), "--format", "json", str(DOCKERFILES[image])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], findings
    assert result.returncode == 0, result.stderr


def test_hadolint_is_really_checking() -> None:
    """The same invocation flags a Dockerfile with the classic mistakes."""
    bad = "FROM ubuntu\nRUN apt-get install curl\nCMD echo hi\n"
    result = subprocess.run(
        [str(HADOLINT), "--format", "json", "-"],
        check=False,
        input=bad,
        capture_output=True,
        text=True,
        timeout=120,
    )
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert {"DL3006", "DL3008", "DL3025"} <= codes


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_every_hadolint_exception_is_explained(image: str) -> None:
    lines = DOCKERFILES[image].read_text().splitlines()
    for index, line in enumerate(lines):
        if "hadolint ignore" in line:
            assert lines[index - 1].startswith("#") and "hadolint" not in lines[index - 1], (
                f"line {index + 1}: an ignore needs a comment saying why"
            )


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_image_is_multi_stage_with_tagged_bases(image: str) -> None:
    parsed = instructions(DOCKERFILES[image].read_text())
    bases = [args.split()[0] for keyword, args in parsed if keyword == "FROM"]
    assert len(bases) >= 2
    for base in bases:
        name, _, tag = base.rpartition(":")
        assert name and tag and tag != "latest" and "$" not in base, base


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_runs_as_a_numeric_non_root_user_with_an_exec_form_entrypoint(image: str) -> None:
    text = DOCKERFILES[image].read_text()
    stage = final_stage(text)
    users = [args for keyword, args in stage if keyword == "USER"]
    assert users, "the final stage sets no USER"
    user = users[-1]
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.MULTILINE))
    resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], user)
    uid, _, gid = resolved.partition(":")
    assert uid.isdigit() and int(uid) >= 10000, user
    assert gid.isdigit() and int(gid) != 0, user
    entrypoints = [args for keyword, args in stage if keyword == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ENTRYPOINTS[image]
    assert re.search(r"PYTHONUNBUFFERED=1", text)
    labels = " ".join(args for keyword, args in stage if keyword == "LABEL")
    for key in ("title", "version", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_operator_image_installs_the_wheel_without_extras() -> None:
    stage = final_stage(DOCKERFILES["operator"].read_text())
    runs = " ".join(args for keyword, args in stage if keyword == "RUN")
    assert re.search(r"pip install /wheels/\*\.whl", runs)
    assert "[" not in runs.split("pip install", 1)[1].split("&&")[0], "no extras in the runtime install"
    assert "torch" not in runs and "nvidia-resiliency-ext" not in runs


def test_trainer_image_verifies_what_it_downloads() -> None:
    text = DOCKERFILES["trainer"].read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.MULTILINE))
    assert re.fullmatch(r"[0-9a-f]{64}", args["EFA_INSTALLER_SHA256"])
    assert re.fullmatch(r"[0-9a-f]{40}", args["AWS_OFI_NCCL_COMMIT"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["NVRX_VERSION"])
    assert "sha256sum --check" in text
    assert 'rev-parse HEAD)" = "${AWS_OFI_NCCL_COMMIT}"' in text
    assert '"nvidia-resiliency-ext==${NVRX_VERSION}"' in text
    base = next(a for k, a in final_stage(text) if k == "FROM")
    assert base.startswith("nvcr.io/nvidia/pytorch:") and base.endswith("-py3")


def test_build_context_keeps_secrets_and_environments_out() -> None:
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    # Deny everything first, then allow back only the sources.
    first_pattern = next(line for line in ignore if line and not line.startswith("#"))
    assert first_pattern == "*"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "README.md",
        "operator",
        "trainer_image",
        "localcluster",
        "demo",
        "contract",
    }
    # Everything the Dockerfiles COPY from the context is allowed in.
    for dockerfile in DOCKERFILES.values():
        for keyword, args in instructions(dockerfile.read_text()):
            if keyword == "COPY" and not args.startswith("--from"):
                for source in args.split()[:-1]:
                    assert source.split("/")[0] in allowed, source


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_each_images_wheel_is_built_from_every_source_folder(image: str) -> None:
    # setuptools finds the packages in pyproject's folders; one a Dockerfile leaves out is missing from
    # that image's wheel, and the first import of it fails in the pod, not in the build.
    folders = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    copied = {
        args.split()[0].split("/")[0]
        for keyword, args in instructions(DOCKERFILES[image].read_text())
        if keyword == "COPY" and not args.startswith("--from")
    }
    assert set(folders["where"]) <= copied


def _runtime_closure(distribution: str) -> set[str]:
    """Normalized names of a distribution and everything its non-extra requirements pull in."""
    seen: set[str] = set()
    pending = [distribution]
    while pending:
        name = canonicalize_name(pending.pop())
        if name in seen:
            continue
        seen.add(name)
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return seen


# Run in a fresh interpreter: any module whose distribution the operator image would not contain
# raises ModuleNotFoundError, as it would there (optional imports degrade, hard ones fail).
_IMAGE_IMPORT_PROBE = """
import importlib.abc, importlib.metadata, json, sys

allowed = set(json.loads(sys.argv[1]))
owners = importlib.metadata.packages_distributions()
normalize = lambda name: name.lower().replace("_", "-").replace(".", "-")


class NotInImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.partition(".")[0]
        dists = owners.get(top)
        if top in sys.stdlib_module_names or dists is None or {normalize(d) for d in dists} & allowed:
            return None
        raise ModuleNotFoundError(f"No module named {name!r} in the operator image", name=name)


sys.meta_path.insert(0, NotInImage())
for module in sys.argv[2:]:
    importlib.import_module(module)
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})))
"""


def _import_in_image(allowed: set[str], *modules: str) -> set[str]:
    """Import ``modules`` with only ``allowed`` distributions installed; the top-level modules loaded."""
    result = subprocess.run(
        [sys.executable, "-c", _IMAGE_IMPORT_PROBE, json.dumps(sorted(allowed)), *modules],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_operator_imports_nothing_beyond_what_its_image_installs() -> None:
    """The operator image installs the wheel without extras: the operator must not need them."""
    imported = _import_in_image(
        _runtime_closure("resilient-training-operator"),
        "rtj_operator.cli",
        "rtj_operator.main",
        "rtj_operator.runtime.handlers",
    )
    assert not imported & {"torch", "nvidia_resiliency_ext", "rtj_trainer", "rtj_localcluster", "rtj_demo"}
    assert {"kopf", "kubernetes", "pydantic", "prometheus_client"} <= imported


def test_trainer_imports_nothing_beyond_what_its_image_installs() -> None:
    """The trainer image adds the wheel (no dependencies), NVRx and prometheus-client to NGC PyTorch
    (torch, psutil)."""
    allowed = {canonicalize_name("resilient-training-operator")}
    for distribution in ("torch", "nvidia-resiliency-ext", "psutil", "prometheus-client"):
        allowed |= _runtime_closure(distribution)
    imported = _import_in_image(allowed, "rtj_trainer.runtime.launch", "rtj_trainer.reference.train")
    assert {"torch", "rtj_trainer"} <= imported
    assert not imported & {"kopf", "rtj_operator", "rtj_localcluster"}


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.runtime"])
def test_trainer_images_pin_prometheus_client_as_the_project_does(dockerfile: str) -> None:
    """The pod runtime writes the trainer's metrics with prometheus-client: both images that carry
    the runtime install the release pyproject.toml pins (the runtime copy takes it along)."""
    pinned = re.findall(r'"prometheus-client==([^"]+)"', (REPO / "pyproject.toml").read_text())
    installed = re.findall(r'"prometheus-client==([^"]+)"', (REPO / "trainer_image" / dockerfile).read_text())
    assert len(pinned) == 1 and installed == pinned
