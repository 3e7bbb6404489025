"""A roofline cost model of LLM serving over a shared base with compressed deltas (pure).

One model, used by the variant planner (`planners.variants`), the
request-level simulator (`sim.serving`) and the ModelVariant controller's
status (swap latency): what one continuous-batching iteration costs on a GPU
type, how many KV-cache tokens fit beside the base and the resident deltas,
and how long a delta or a whole model takes to reach the GPU.

An iteration runs the base once for the whole batch and each distinct delta
once for the rows that use it (DeltaZip's decoupled base + SBMM). Its time is
the larger of compute (2 FLOPs per parameter per token) and memory traffic
(the base weights, every distinct delta's compressed bytes, and the KV cache
of every decoding sequence), each at an achieved fraction of the datasheet
peak, plus a fixed launch overhead and a per-distinct-delta kernel cost.
The datasheet figures and the efficiency factors are cited in
docs/variants.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "GPUS",
    "CostModel",
    "GpuPerf",
    "ModelShape",
    "Tier",
    "Tiers",
    "gpu_perf",
]

MIB = 1024 * 1024
GB = 1e9


@dataclass(frozen=True)
class GpuPerf:
    """Datasheet peaks of a GPU type: dense FP16/BF16 tensor FLOPS, HBM and host link."""

    name: str
    memory_mib: int
    tflops: float
    hbm_gbps: float
    host_link_gbps: float
    """Achievable host-to-GPU copy bandwidth (pinned memory), GB/s."""


GPUS: dict[str, GpuPerf] = {
    g.name: g
    for g in (
        # NVIDIA H100 SXM5 datasheet: 989 TFLOPS BF16 dense, 3.35 TB/s; PCIe Gen5 x16
        GpuPerf("H100-SXM5-80GB", 81559, 989.0, 3350.0, 50.0),
        # NVIDIA A100 datasheet: 312 TFLOPS BF16 dense; 80GB SXM 2039 GB/s, 40GB 1555 GB/s; Gen4
        GpuPerf("A100-SXM4-80GB", 81920, 312.0, 2039.0, 25.0),
        GpuPerf("A100-SXM4-40GB", 40960, 312.0, 1555.0, 25.0),
        # NVIDIA V100 SXM2: 125 TFLOPS FP16 tensor, 900 GB/s; PCIe Gen3 x16
        GpuPerf("V100-SXM2-32GB", 32510, 125.0, 900.0, 12.0),
        # NVIDIA L4: 121 TFLOPS FP16 dense, 300 GB/s; PCIe Gen4 x16
        GpuPerf("L4", 23034, 121.0, 300.0, 25.0),
        # NVIDIA T4: 65 TFLOPS FP16, 320 GB/s; PCIe Gen3 x16
        GpuPerf("T4", 15109, 65.0, 320.0, 12.0),
        # NVIDIA A10: 125 TFLOPS FP16 dense, 600 GB/s; PCIe Gen4 x16
        GpuPerf("A10", 23028, 125.0, 600.0, 25.0),
    )
}


def gpu_perf(name: str, memory_mib: int | None = None) -> GpuPerf | None:
    """The catalogue entry for a GPU type, with the node's memory when it reports one."""
    perf = GPUS.get(name)
    if perf is None:
        return None
    if memory_mib:
        return GpuPerf(perf.name, memory_mib, perf.tflops, perf.hbm_gbps, perf.host_link_gbps)
    return perf


@dataclass(frozen=True)
class ModelShape:
    """The base model: parameters, weight bytes and KV-cache bytes per token."""

    params_b: float
    weight_mib: int
    kv_bytes_per_token: int

    @classmethod
    def of(cls, size_mib: int, params_b: float | None = None) -> ModelShape:
        """From the base's size (and parameter count when known; else FP16 weights).

        KV bytes per token follow the Llama-2 shape without grouped-query
        attention (hidden H with params ~ 12 L H^2 and L = H / 128): K and V,
        2 bytes each, per layer: 4 L H. Llama-2-7B gives 512 KiB.
        """
        params = params_b if params_b is not None else size_mib * MIB / 2 / 1e9
        hidden = (params * 1e9 * 128 / 12) ** (1 / 3)
        layers = max(1.0, hidden / 128)
        return cls(params, size_mib, int(4 * layers * hidden))


class Tier(StrEnum):
    """Where weights are: GPU memory, host memory or disk."""

    GPU = "GPU"
    HOST = "Host"
    DISK = "Disk"


@dataclass(frozen=True)
class Tiers:
    """Bandwidths between tiers and the host memory kept for weights.

    Defaults: a local NVMe read of 2 GB/s (datacenter Gen4 NVMe reads 3-7 GB/s
    sequentially; 2 leaves room for a shared device); unpacking a compressed
    delta into the serving layout at 50 GB/s on the GPU; 1 TiB of host memory
    for weights (a DGX A100 has 1 TB, the demo cluster's A100 nodes 1 TiB).
    """

    disk_gbps: float = 2.0
    unpack_gbps: float = 50.0
    host_mib: int = 1024 * 1024


@dataclass(frozen=True)
class CostModel:
    """Iteration, KV and swap costs of one base on one GPU type (see the module docstring).

    Efficiencies: decode reaches about 60-80 % of peak memory bandwidth and
    prefill about half the peak FLOPS in vLLM-class servers (docs/variants.md);
    `delta_kernel_ms` is the launch and decompression cost of each distinct
    delta's SBMM kernels per iteration.
    """

    gpu: GpuPerf
    shape: ModelShape
    tiers: Tiers = Tiers()
    mbu: float = 0.7
    mfu: float = 0.5
    overhead_ms: float = 2.0
    delta_kernel_ms: float = 0.5
    activation_reserve_mib: int = 2048

    def iteration_s(
        self,
        prefill_tokens: float,
        decode_seqs: int,
        kv_tokens: float,
        delta_mib: float,
        distinct_deltas: int,
    ) -> float:
        """Seconds for one iteration: prefill and decode tokens, KV read, distinct deltas."""
        flops = 2 * self.shape.params_b * 1e9 * (prefill_tokens + decode_seqs)
        compute = flops / (self.gpu.tflops * 1e12 * self.mfu)
        moved = self.shape.weight_mib * MIB + delta_mib * MIB
        moved += kv_tokens * self.shape.kv_bytes_per_token
        memory = moved / (self.gpu.hbm_gbps * GB * self.mbu)
        fixed = (self.overhead_ms + self.delta_kernel_ms * distinct_deltas) / 1000
        return max(compute, memory) + fixed

    def kv_tokens(self, delta_mib: float) -> int:
        """KV-cache tokens that fit beside the base, `delta_mib` of deltas and activations."""
        free = self.gpu.memory_mib - self.shape.weight_mib - delta_mib
        free -= self.activation_reserve_mib
        return max(0, int(free * MIB // self.shape.kv_bytes_per_token))

    def load_s(self, size_mib: float, source: Tier) -> float:
        """Seconds to bring `size_mib` of weights to the GPU from `source`."""
        if source is Tier.GPU:
            return 0.0
        nbytes = size_mib * MIB
        seconds = nbytes / (self.gpu.host_link_gbps * GB) + nbytes / (self.tiers.unpack_gbps * GB)
        if source is Tier.DISK:
            seconds += nbytes / (self.tiers.disk_gbps * GB)
        return seconds
