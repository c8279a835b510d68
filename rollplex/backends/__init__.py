"""Backends that run a plan's ops: torch/ (transformers models), vllm/, fsdp/."""
