"""HardwareSpec: the GPUs a plan runs on, in the units the cost model needs; and the
match between a spec and the device a job finds (DeviceInfo, `hardware_for_device`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

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
    hbm_reserve: float = Field(
        0.05,
        ge=0.0,
        lt=0.5,
        description="Share of each GPU's HBM the plan leaves unplaced: the CUDA context, "
        "kernels' workspaces and the caching allocator's slack, which no op's tensors "
        "account for. On an H200, PyTorch's measured peaks ran 2-8% above planned ones, with "
        "about 2 GiB more outside PyTorch (bench/results/gpu_step, runs 10-12).",
    )

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
    def budget_bytes(self) -> int:
        """What a plan may place per GPU: the HBM less its reserve."""
        return int(self.hbm_gib * (1.0 - self.hbm_reserve) * GIB)

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
    # One H100 SXM 80 GB (HBM3 at 3.35 TB/s; same SMs and bf16 peak as the H200).
    "h100": _h200(1).model_copy(
        update={"name": "h100", "gpu": "NVIDIA H100", "hbm_gib": 79.6, "hbm_bandwidth_gbps": 3350}
    ),
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


# -- the device a job runs on ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What torch.cuda says about the GPUs of this host (jobs/sizing.read_device): tests
    feed made-up ones."""

    name: str  # torch.cuda.get_device_name, e.g. "NVIDIA H200"
    total_memory_bytes: int  # of one GPU
    count: int  # GPUs visible to this process

    @property
    def total_gib(self) -> float:
        return self.total_memory_bytes / GIB


# Peak rates of GPUs with no preset, from the vendors' data sheets (SXM parts): a detected one
# is planned with these. model -> (HBM GB/s, dense bf16 TFLOP/s, SMs, NVLink GB/s one way)
GPU_RATES: dict[str, tuple[float, float, int, float]] = {
    "H200": (4800, 989, 132, 450),
    "H100": (3350, 989, 132, 450),
    "H800": (3350, 989, 132, 200),
    "H20": (4000, 148, 78, 450),
    "A100": (2039, 312, 108, 300),
    "A800": (2039, 312, 108, 200),
}
# An unknown GPU is planned with an A100's rates (the oldest part listed), and said so.
FALLBACK_MODEL = "A100"


def gpu_model(name: str) -> str:
    """The model token of a device or preset name: "NVIDIA H100 80GB HBM3" -> "H100",
    "NVIDIA A100-SXM4-80GB" -> "A100", "CPU" -> "CPU"."""
    words = re.split(r"[\s\-_]+", name.upper().replace("NVIDIA", " ").strip())
    return words[0] if words and words[0] else name.upper()


def hardware_for_device(info: DeviceInfo) -> tuple[HardwareSpec, str]:
    """The one-GPU spec for the detected device, and a line saying where it came from: the
    preset of the same GPU model, else one built from GPU_RATES and the device's memory."""
    model = gpu_model(info.name)
    for preset in HARDWARE_PRESETS.values():
        if preset.num_gpus == 1 and gpu_model(preset.gpu) == model:
            if preset.hbm_gib <= info.total_gib * 1.02:
                return preset, f"hardware '{preset.name}' (detected {info.name})"
            smaller = preset.model_copy(update={"hbm_gib": round(info.total_gib, 1)})
            return smaller, (
                f"hardware '{preset.name}' with hbm_gib={smaller.hbm_gib:g} (detected "
                f"{info.name} with {info.total_gib:.1f} GiB)"
            )
    known = model in GPU_RATES
    bw, tflops, sms, nvlink = GPU_RATES[model if known else FALLBACK_MODEL]
    spec = HardwareSpec(
        name=f"detected-{model.lower()}",
        gpu=info.name,
        num_gpus=1,
        gpus_per_node=max(1, info.count),
        hbm_gib=round(info.total_gib * 0.98, 1),  # what the CUDA context leaves, roughly
        hbm_bandwidth_gbps=bw,
        bf16_tflops=tflops,
        sm_count=sms,
        nvlink_gbps=nvlink,
    )
    how = "its data-sheet rates" if known else f"an {FALLBACK_MODEL}'s rates (unknown GPU)"
    return spec, f"hardware '{spec.name}' built for {info.name} from {how}"


def device_disagreement(hw: HardwareSpec, info: DeviceInfo) -> str | None:
    """Why an explicit `hardware` spec does not describe the detected device (None: it does)."""
    if gpu_model(hw.gpu) != gpu_model(info.name):
        return f"hardware.gpu='{hw.gpu}' but the device is '{info.name}'"
    if hw.hbm_gib > info.total_gib * 1.02:
        return f"hardware.hbm_gib={hw.hbm_gib:g} but the device has {info.total_gib:.1f} GiB"
    if min(hw.num_gpus, hw.gpus_per_node) > info.count:
        return f"hardware.num_gpus={hw.num_gpus} but this host shows {info.count} GPU(s)"
    return None
