"""Rollplex: lifetime-aware planning and execution of RL post-training steps for VLMs."""

__version__ = "0.1.0"
