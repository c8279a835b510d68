r"""The FSDP2 trainer role (`backend.trainer=fsdp`, or `backend=fsdp`; build.py says what runs
where). Imported lazily by the role registry.

    torchrun --standalone --nproc-per-node 2 -m rollplex.cli train backend=fsdp \
        hydra.run.dir=runs/b        # add train.resume=runs/b on any rank count (DCP)
Rank 0 writes the run folder; rank N logs to `ranks/rankN.log`.
"""
