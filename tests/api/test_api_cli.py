"""`rtj render` and `rtj crd` as users run them (the installed console script), and the stdlib guard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from crd_tools import CRD_FILE, REPO

RTJ = str(Path(sys.executable).with_name("rtj"))


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RTJ, *args], input=stdin, capture_output=True, text=True, cwd=REPO, timeout=120, check=False
    )


def test_rtj_crd_prints_the_file_in_crds() -> None:
    result = run("crd")
    assert result.returncode == 0, result.stderr
    assert result.stdout == CRD_FILE.read_text(encoding="utf-8")


def test_rtj_render_prints_every_child_as_yaml_and_json() -> None:
    result = run("render", "-f", "examples/p5-8node-spares.yaml")
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    kinds = [o["kind"] for o in objects]
    assert kinds.count("Pod") == 10 and "PersistentVolume" in kinds
    assert run("render", "-f", "examples/p5-8node-spares.yaml").stdout == result.stdout  # deterministic
    as_json = run("render", "-f", "examples/p5-8node-spares.yaml", "-o", "json")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout)["items"] == objects


def test_rtj_render_reads_stdin_and_applies_the_namespace() -> None:
    manifest = (
        (REPO / "examples" / "local-cpu.yaml")
        .read_text(encoding="utf-8")
        .replace("  namespace: default\n", "")
    )
    result = run("render", "-f", "-", "--namespace", "team-a", stdin=manifest)
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert {o["metadata"]["namespace"] for o in objects} == {"team-a"}


def test_rtj_render_names_the_bad_field_and_exits_2(tmp_path: Path) -> None:
    job = yaml.safe_load((REPO / "examples" / "p5-2node.yaml").read_text(encoding="utf-8"))
    job["spec"]["checkpoint"]["storage"]["existingClaim"] = {"claimName": "other"}
    job["spec"]["nodes"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(job), encoding="utf-8")
    result = run("render", "-f", str(bad))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert "spec.nodes: Input should be greater than or equal to 1" in result.stderr
    assert (
        "spec.checkpoint.storage: exactly one of fsxStatic, dynamic, existingClaim must be set"
        in result.stderr
    )


def test_rtj_render_reports_unreadable_input_without_a_traceback(tmp_path: Path) -> None:
    missing = run("render", "-f", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n", encoding="utf-8")
    result = run("render", "-f", str(broken))
    assert result.returncode == 2 and "not valid YAML" in result.stderr and "Traceback" not in result.stderr


def test_the_standard_library_operator_module_is_not_shadowed() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import operator; operator.itemgetter; print(operator.__file__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "site-packages" not in result.stdout and not result.stdout.startswith(str(REPO))


def test_rtj_render_accepts_and_refuses_what_the_api_server_does() -> None:
    manifest = (REPO / "examples" / "local-cpu.yaml").read_text(encoding="utf-8")
    job = yaml.safe_load(manifest)
    job["spec"]["nodes"] = 1.0  # an integer to the API server's schema check
    result = run("render", "-f", "-", stdin=yaml.safe_dump(job))
    assert result.returncode == 0, result.stderr
    job["spec"]["env"] = [{"name": "A=B", "value": "1"}]
    refused = run("render", "-f", "-", stdin=yaml.safe_dump(job))
    assert refused.returncode != 0 and "spec.env[0].name" in refused.stderr, refused.stderr
