"""Two training jobs with the same rendezvous port train side by side in one local cluster: each
job's worker 0 runs torch's TCPStore on all addresses of port 29500, which the pod network library
makes its own pod IP (docs/localcluster.md, Pod network). Real ft_launcher, rendezvous and gloo."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from operator_cluster import apply, install_crd, job_status, new_namespace
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import require_podnet, wait_for
from rtj_operator.main import EmbeddedOperator

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.local_cluster(nodes=4, profile="cpu")
def test_two_jobs_on_the_same_rendezvous_port_both_succeed(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    require_podnet()
    kubeconfig = local_cluster.kubeconfig_path
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    example = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    names = ("port-a", "port-b")
    with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
        for name in names:
            job = yaml.safe_load(yaml.safe_dump(example))
            job["metadata"] = {"name": name, "namespace": namespace}
            job["spec"]["processesPerNode"] = 1
            job["spec"]["args"] = ["--steps", "20", "--hidden", "16", "--layers", "1"]
            apply(kubeconfig, job, tmp_path)

        seen: dict[str, str] = {}

        def states() -> dict[str, str] | None:
            seen.update({name: str(job_status(kubeconfig, namespace, name).get("state")) for name in names})
            assert "Failed" not in seen.values(), seen
            return seen if set(seen.values()) == {"Succeeded"} else None

        try:
            wait_for(states, timeout=300, interval=2, message="both jobs to succeed")
        except AssertionError as error:
            raise AssertionError(f"{error}; states: {seen}") from None
        for name in names:
            status = job_status(kubeconfig, namespace, name)
            assert status["progress"]["step"] == 20
            assert status.get("restarts", {}).get("inJob", 0) == 0, status
