"""Prompt data: sources, samples, rendering and rewards."""
