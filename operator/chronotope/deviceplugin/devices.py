"""What the device plugin advertises to the kubelet, and which IDs it prefers.

The kubelet counts extended resources in opaque device IDs. For a whole-GPU
resource each physical GPU is one device, named by its UUID. For a shared
resource (`chronotope.dev/gpu-share`) each GPU is advertised as
`shares_per_gpu` *virtual* devices `<uuid>::<k>`: the kubelet's count of free
IDs then bounds how many sharers a node admits, while what a container really
gets (which GPU, how much memory and compute) comes from the binder's
assignment, read in Allocate. This is HAMi's device-split model.

Pure: the inventory is plain data; preference is a function of its inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from chronotope.sharing.assignment import gpu_uuid

__all__ = ["MAX_DEVICE_ID_LENGTH", "DeviceInventory", "gpu_of"]

MAX_DEVICE_ID_LENGTH = 63  # the kubelet rejects longer device IDs
_SEPARATOR = "::"


def gpu_of(device_id: str) -> str:
    """The GPU UUID a (virtual or whole) device ID belongs to."""
    return device_id.split(_SEPARATOR, 1)[0]


@dataclass(frozen=True, slots=True)
class DeviceInventory:
    """The GPUs of one node and how many device IDs each is advertised as."""

    gpu_uuids: tuple[str, ...]
    shares_per_gpu: int = 1

    def __post_init__(self) -> None:
        """Reject a share count below 1, repeated or malformed UUIDs, and over-long device IDs."""
        if self.shares_per_gpu < 1:
            raise ValueError(f"shares per GPU must be >= 1, got {self.shares_per_gpu}")
        if len(set(self.gpu_uuids)) != len(self.gpu_uuids):
            raise ValueError(f"GPU UUIDs repeat: {self.gpu_uuids}")
        for uuid in self.gpu_uuids:
            if not uuid or _SEPARATOR in uuid:
                raise ValueError(f"GPU UUID {uuid!r} is empty or contains {_SEPARATOR!r}")
        for device_id in self.device_ids():
            if len(device_id) > MAX_DEVICE_ID_LENGTH:
                raise ValueError(
                    f"device ID {device_id!r} is longer than {MAX_DEVICE_ID_LENGTH} characters"
                )

    @classmethod
    def simulated(cls, node: str, gpus: int, shares_per_gpu: int = 1) -> DeviceInventory:
        """The inventory of a simulated node: UUIDs `GPU-<node>-<i>` for i < gpus."""
        return cls(tuple(gpu_uuid(node, i) for i in range(gpus)), shares_per_gpu)

    @property
    def shared(self) -> bool:
        """Whether each GPU is split into several virtual devices."""
        return self.shares_per_gpu > 1

    def device_ids(self) -> list[str]:
        """Every advertised device ID, GPU by GPU."""
        if not self.shared:
            return list(self.gpu_uuids)
        return [
            f"{uuid}{_SEPARATOR}{k}" for uuid in self.gpu_uuids for k in range(self.shares_per_gpu)
        ]

    def knows(self, device_id: str) -> bool:
        """Whether `device_id` is one this inventory advertises."""
        return device_id in set(self.device_ids())

    def preferred(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        assigned_uuids: Iterable[str] = (),
    ) -> list[str]:
        """A preferred set of `size` IDs out of `available` (a hint to the kubelet).

        Keeps `must_include`; then takes one slot on each GPU of the pending
        pod's assignment, if known, so the kubelet's bookkeeping matches the
        real placement; then spreads over distinct GPUs (in this model a pod
        asking for k devices gets k different GPUs), then fills with whatever
        is left.
        """
        chosen: list[str] = []
        for device_id in must_include:
            if device_id not in chosen:
                chosen.append(device_id)
        free = [d for d in available if d not in chosen]

        def take_one_on(uuid: str) -> None:
            for device_id in free:
                if gpu_of(device_id) == uuid:
                    chosen.append(device_id)
                    free.remove(device_id)
                    return

        used = {gpu_of(d) for d in chosen}
        for uuid in assigned_uuids:
            if len(chosen) >= size:
                break
            if uuid not in used:
                take_one_on(uuid)
                used.add(uuid)
        for device_id in list(free):
            if len(chosen) >= size:
                break
            if gpu_of(device_id) not in used:
                chosen.append(device_id)
                free.remove(device_id)
                used.add(gpu_of(device_id))
        chosen.extend(free[: max(0, size - len(chosen))])
        return chosen[: max(size, len(must_include))]
