"""The ResilientTrainingJob operator: API models, pure rendering and reconciling, kopf wiring."""

__version__ = "0.1.0"
