"""The FSDP2 trainer role (`backend.trainer=fsdp`, or `backend=fsdp`; build.py says what
runs where).

    # one process (a private one-rank gloo group), the same job:
    rollplex train backend=fsdp hydra.run.dir=runs/a
    # N processes on one host: gloo on CPU, NCCL on GPUs (cuda:LOCAL_RANK per rank)
    torchrun --standalone --nproc-per-node 2 -m rollplex.cli train backend=fsdp \\
        hydra.run.dir=runs/b
    torchrun --standalone --nproc-per-node 2 -m rollplex.cli train backend=fsdp \\
        train.device=cuda backend.fsdp.param_dtype=bfloat16 hydra.run.dir=runs/c
    # resume on any number of ranks (DCP reshards):
    torchrun --standalone --nproc-per-node 4 -m rollplex.cli train backend=fsdp \\
        train.resume=runs/b hydra.run.dir=runs/d

Rank 0 picks the run folder (Hydra's, broadcast to the others) and writes everything in
it; rank N logs to `ranks/rankN.log`. Imported lazily by the role registry, so
selecting another trainer never imports torch.distributed.
"""
