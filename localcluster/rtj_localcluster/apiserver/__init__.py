"""The embedded Kubernetes-compatible API server of the local cluster.

kubectl 1.32, Helm 4, kopf and the official ``kubernetes`` Python client talk to it over HTTPS as to
a real cluster (docs/localcluster.md lists what is and is not implemented). The rest of the local
cluster (nodes, scheduler, process kubelet) are clients of it like real controllers are.

Python API (for the composer, ``rtj_localcluster``, and tests)::

    server = ApiServer(state_dir, port=0)   # makes <state_dir>/pki/{ca.crt,apiserver.crt,...}
    server.start()                          # own thread + event loop; returns when serving
    server.url                              # "https://127.0.0.1:<port>"
    server.ca_path                          # the CA certificate (PEM)
    server.kubeconfig_path                  # <state_dir>/kubeconfig, written by start()
    server.write_kubeconfig(path)           # another copy (CA inline, any bearer token accepted)
    server.call(lambda cluster: ...)        # run a function on the server's loop (tests, tools)
    server.stop()

Options: ``host`` (127.0.0.1), ``watch_history`` (events kept for watch resume; older
resourceVersions get 410 Gone), ``bookmark_interval`` (seconds between BOOKMARK events),
``log_root`` (default ``state_dir``). State is in memory only: a restart starts an empty cluster.

Pod logs: the kubelet writes ``<log_root>/pods/<namespace>_<pod>_<uid>/<container>.log`` (and
``<container>.previous.log`` for the previous instance); ``GET pods/<name>/log`` reads them, with
``follow``, ``tailLines``, ``limitBytes`` and ``previous``.

Modules: ``server`` (HTTP, ApiServer), ``core`` (object semantics, garbage collection), ``store``
(objects, resourceVersion, watch fan-out), ``resources`` (kinds, discovery), ``schema`` and ``cel``
(custom-object validation), ``patch``, ``selectors``, ``tables`` and ``jsonpath`` (kubectl
printing), ``openapi``, ``errors``.
"""

from .server import ApiServer

__all__ = ["ApiServer"]
