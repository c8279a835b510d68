"""The FSDP2 trainer backend (`train.backend=fsdp`): see backend.py. Imported lazily by
the backends registry, so selecting another backend never imports torch.distributed."""
