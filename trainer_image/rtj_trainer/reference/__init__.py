"""The reference trainer: ``rtj-train``, the project's own FSDP2 training program.

``train`` runs the training loop under NVRx's in-process ``Wrapper`` (``restart``), on the
workload in ``model``, with the memory tier (``replica``: each rank's state held by a peer on
another node); ``resume`` decides where each iteration resumes, ``checkpoints`` saves and waits for
the commits, ``node_report`` keeps the node's report and recovery events. It is the library's
reference user: everything it does resiliently goes through the public facade (``rtj_trainer``'s
``__all__``), as a user's script does: its checkpoints, progress reports, drains, heartbeats, node
faults and in-process wrapper (docs/trainer.md, "Modules").

May import: the facade's public names and ``rtj_trainer.rehearsal`` (its planned faults), never a
module of ``rtj_trainer.library`` or ``rtj_trainer.runtime``; nothing imports this part
(tests/trainer/test_trainer_layout.py holds both). This file imports nothing.
"""
