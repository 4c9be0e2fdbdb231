"""The library: what ``import rtj_trainer`` gives a training script, and the parts every other part shares.

``session`` is the public ``Session`` behind the facade (``rtj_trainer/__init__.py`` re-exports it;
docs/library.md is its reference), with its parts ``session_progress``, ``session_checkpoints``,
``state_tree`` and ``collectives``. The other modules are what a session is built from and what the
pod runtime, the reference trainer and the rehearsal tools share with it: the operator's environment
contract (``env``), progress reports (``progress``), sharded async checkpoints (``checkpoint``, made
of ``checkpoint_files``, ``checkpoint_staging``, ``checkpoint_writes``, ``checkpoint_commits`` and
``checkpoint_reads``), drains (``drain``), faults blamed on the node (``node_faults``), everything
NVRx-version specific (``nvrx_compat``) and supervisor mode's store keys and exit status
(``world``). ``heartbeats`` is the public ``Heartbeats``, ``in_process`` the public
``wrap_in_process``; ``env``'s ``JobSettings``, ``world``'s names, and the building blocks of
``checkpoint`` (``CheckpointManager``), ``drain`` (``DrainRequest``, ``install_drain_handler``) and
``progress`` (``Progress``, ``RecoveryEvent``, ``Reporter``, ``load_node_state``,
``train_start_time``) are public too.

May import: nothing of ``rtj_trainer.runtime``, ``rtj_trainer.reference`` or
``rtj_trainer.rehearsal`` (tests/trainer/test_trainer_layout.py holds it). Users import the facade,
never a module here. This file imports nothing, so importing one module does not load the others.
"""
