"""HardwareSpec: the GPUs a plan runs on, in the units the cost model needs."""

from __future__ import annotations

from pydantic import Field, model_validator

from rollplex.specs.base import Spec

GIB = 1 << 30


class HardwareSpec(Spec):
    """A homogeneous GPU cluster."""

    name: str = Field(..., description="Preset name, e.g. h200.")
    gpu: str = Field(..., description="GPU model, for traces and tables.")
    num_gpus: int = Field(..., ge=1, description="GPUs in the cluster.")
    gpus_per_node: int = Field(8, ge=1, description="GPUs that share NVLink.")
    hbm_gib: float = Field(..., gt=0, description="Usable HBM per GPU (GiB).")
    hbm_bandwidth_gbps: float = Field(..., gt=0, description="Peak HBM bandwidth (GB/s).")
    bf16_tflops: float = Field(..., gt=0, description="Dense bf16 matmul peak (TFLOP/s).")
    sm_count: int = Field(132, ge=1, description="Streaming multiprocessors per GPU.")
    nvlink_gbps: float = Field(..., gt=0, description="Per-GPU NVLink bandwidth, one way (GB/s).")
    internode_gbps: float = Field(50.0, gt=0, description="Per-GPU network bandwidth (GB/s).")
    host_link_gbps: float = Field(50.0, gt=0, description="GPU<->host copy bandwidth (GB/s).")
    host_memory_gib: float = Field(1024.0, gt=0, description="Host memory per node (GiB).")

    @model_validator(mode="after")
    def _check(self) -> HardwareSpec:
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise ValueError(
                f"num_gpus={self.num_gpus} must be a multiple of gpus_per_node={self.gpus_per_node}"
            )
        return self

    @property
    def label(self) -> str:
        """The preset's name, plus every field overridden from it: `h800x32 (num_gpus=1024)`."""
        preset = HARDWARE_PRESETS.get(self.name)
        if preset is None:
            return self.name
        changed = [f"{k}={v}" for k, v in self.model_dump().items() if getattr(preset, k) != v]
        return f"{self.name} ({', '.join(changed)})" if changed else self.name

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * GIB)

    @property
    def nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def peak_flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def hbm_bandwidth(self) -> float:
        return self.hbm_bandwidth_gbps * 1e9


def _h200(n: int) -> HardwareSpec:
    return HardwareSpec(
        name="h200" if n == 1 else f"h200x{n}",
        gpu="NVIDIA H200",
        num_gpus=n,
        gpus_per_node=8,
        hbm_gib=139.8,
        hbm_bandwidth_gbps=4800,
        bf16_tflops=989,
        sm_count=132,
        nvlink_gbps=450,
        internode_gbps=50,
        host_link_gbps=55,
    )


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    "h200": _h200(1),
    "h200x2": _h200(2),
    "h200x8": _h200(8),
    # The paper's cluster: 4 nodes of 8 H800 80 GB (NVLink cut to 400 GB/s both ways).
    "h800x32": HardwareSpec(
        name="h800x32",
        gpu="NVIDIA H800",
        num_gpus=32,
        gpus_per_node=8,
        hbm_gib=79.6,
        hbm_bandwidth_gbps=3350,
        bf16_tflops=989,
        sm_count=132,
        nvlink_gbps=200,
        internode_gbps=50,
        host_link_gbps=55,
    ),
    "cpu": HardwareSpec(
        name="cpu",
        gpu="CPU",
        num_gpus=1,
        gpus_per_node=1,
        hbm_gib=16,
        hbm_bandwidth_gbps=50,
        bf16_tflops=1,
        sm_count=2,
        nvlink_gbps=10,
        internode_gbps=10,
        host_link_gbps=10,
    ),
}
