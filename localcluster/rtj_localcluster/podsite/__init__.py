"""The directory the process kubelet puts first on every pod's PYTHONPATH (see ``sitecustomize``)."""
