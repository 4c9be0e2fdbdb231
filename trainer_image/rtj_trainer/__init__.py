"""The trainer: FSDP training under NVRx async checkpoints, in-process restart and ft_launcher."""
