"""The pod runtime: the processes the operator starts in a pod, around whatever training command runs.

``launch`` is ``rtj-launch``, the worker container's main process: it runs ft_launcher as its child
(or, in supervisor mode, the ranks themselves: ``supervisor``), serves the pod's progress endpoint
(``endpoint``, with ``metrics`` and the launcher's view of the ranks, ``launcher_view``), marks
drains and writes the termination message. ``rankshim`` runs in front of each rank; ``store`` is
``rtj-store``, the job's store pod; ``checkpoint_dir`` is the init container that prepares the
checkpoint directory. All of it works for any training script, with or without the library.

May import: ``rtj_trainer.library`` only, never ``rtj_trainer.reference`` or
``rtj_trainer.rehearsal`` (tests/trainer/test_trainer_layout.py holds it); ``rankshim`` imports
nothing of ``rtj_trainer`` at all. This file imports nothing: ``python -m
rtj_trainer.runtime.rankshim`` loads only the standard library.
"""
