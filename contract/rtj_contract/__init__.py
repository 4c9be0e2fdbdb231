"""What the operator, the trainer and the local cluster read alike, written once: the environment the
operator renders for the pod runtime (``env``), where a pod serves its progress and the report's
version (``progress``), the store pod's ports (``stores``), how a container says why it ended
(``termination``: exit statuses and the ``FaultReason:`` line), timestamps (``times``) and Kubernetes resource
quantities (``quantity``).

Standard library only, and nothing of the project's other packages: the operator's image and the
trainer's (and a user's image, through the pod runtime) each carry it. Its own folder (``contract/``),
like the other parts of the project; a test holds it to both rules.
"""
