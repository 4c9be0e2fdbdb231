"""Rehearsal tools: faults on purpose, to show each recovery layer working.

``fault_injection`` parses ``RTJ_FAULTS`` and fires its planned faults in a training run (the reference
trainer calls it each step); ``checkpoint_drill`` saves sharded checkpoints until killed and then
verifies what survived (the tests and bench/trainer_bench.py drive it).

May import: ``rtj_trainer.library`` only (tests/trainer/test_trainer_layout.py holds it). This file
imports nothing.
"""
