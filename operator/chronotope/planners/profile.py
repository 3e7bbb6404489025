"""SAILOR-style model profiles: measured per-layer times plus an analytic memory model.

The SAILOR artifact (eth-easl/sailor, `sailor/Planner/.../profiles/`) stores, per
model and GPU type, `profile.json` shaped ``{microbatch: {tp: {layer: [fwd_s,
bwd_s, update_s]}}}`` and, separately, a training config (hidden size, sequence
length, layers, vocabulary, global batch). The profiles carry no memory numbers,
so memory per GPU is computed here from the config with the usual mixed-precision
Adam accounting (16 bytes per parameter, sharded by tensor parallelism) and the
Megatron activation estimate ``s*b*h*(34 + 5*a*s/h)`` bytes per layer and
microbatch (Korthikanti et al., 2022), divided by the TP degree.

Pure: parsing and arithmetic only; reading files happens in `load_*` helpers that
take explicit paths.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "BYTES_PER_PARAM_TRAINING",
    "CONFIG_KEY",
    "PROFILE_KEY_PREFIX",
    "GpuTypeProfile",
    "LayerTimes",
    "ModelConfig",
    "ModelProfile",
    "load_model_profile",
    "profile_from_data",
    "profile_to_data",
]

CONFIG_KEY = "config.json"
PROFILE_KEY_PREFIX = "profile-"
"""A profile as ConfigMap data: `config.json` plus `profile-<GPU type>.json` per type."""

# fp16 weights (2) + fp16 grads (2) + fp32 master weights, Adam m and v (4+4+4).
BYTES_PER_PARAM_TRAINING = 16


class LayerTimes(BaseModel):
    """Seconds for one microbatch through one layer on one GPU of a TP group."""

    model_config = ConfigDict(frozen=True)

    fwd: float = Field(ge=0)
    bwd: float = Field(ge=0)
    update: float = Field(ge=0)


class ModelConfig(BaseModel):
    """The parts of a SAILOR training config the planner needs."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    model: str
    global_batch_size: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    sequence_length: int = Field(gt=0)
    num_layers: int = Field(gt=0, description="transformer blocks")
    vocab_size: int = Field(gt=0)
    heads: int = Field(gt=0)

    def layer_params(self, index: int, num_all_layers: int) -> int:
        """Parameters of profiled layer `index` (0 = embedding, last = head)."""
        h = self.hidden_size
        if index == 0:
            return (self.vocab_size + self.sequence_length) * h
        if index == num_all_layers - 1:
            return 2 * h  # final norm; the LM head is tied to the embedding
        return 12 * h * h + 13 * h

    def layer_activation_bytes(self, index: int, num_all_layers: int, microbatch: int) -> int:
        """Activation bytes one microbatch keeps alive in one layer (before TP split)."""
        s, h, a = self.sequence_length, self.hidden_size, self.heads
        if index in (0, num_all_layers - 1):
            return 2 * s * microbatch * h
        return int(s * microbatch * h * (34 + 5 * a * s / h))

    def boundary_activation_bytes(self, microbatch: int) -> int:
        """fp16 activations sent between pipeline stages for one microbatch."""
        return 2 * self.sequence_length * microbatch * self.hidden_size


class GpuTypeProfile(BaseModel):
    """Measured layer times of one model on one GPU type."""

    model_config = ConfigDict(frozen=True)

    gpu_type: str
    # keyed "mbs/tp" because pydantic/JSON keys must be strings
    layers: dict[str, tuple[LayerTimes, ...]]

    def times(self, microbatch: int, tp: int) -> tuple[LayerTimes, ...] | None:
        """The layer times profiled at `microbatch` and TP degree `tp`, or None if not profiled."""
        return self.layers.get(f"{microbatch}/{tp}")

    def options(self) -> list[tuple[int, int]]:
        """(microbatch, tp) pairs that were profiled, i.e. that SAILOR could run."""
        out = []
        for key in self.layers:
            mbs, tp = key.split("/")
            out.append((int(mbs), int(tp)))
        return sorted(out)


class ModelProfile(BaseModel):
    """A model's config and its profiles on every GPU type that was measured."""

    model_config = ConfigDict(frozen=True)

    config: ModelConfig
    gpus: dict[str, GpuTypeProfile]

    @property
    def num_all_layers(self) -> int:
        """How many layers were profiled, embedding and head included (from the first GPU type)."""
        first = next(iter(self.gpus.values()))
        return len(next(iter(first.layers.values())))


def _parse_profile(
    gpu_type: str, raw: dict[str, dict[str, dict[str, list[float]]]]
) -> GpuTypeProfile:
    layers: dict[str, tuple[LayerTimes, ...]] = {}
    for mbs, by_tp in raw.items():
        for tp, by_layer in by_tp.items():
            ordered = sorted(by_layer.items(), key=lambda kv: int(kv[0]))
            layers[f"{int(mbs)}/{int(tp)}"] = tuple(
                LayerTimes(fwd=v[0], bwd=v[1], update=v[2]) for _, v in ordered
            )
    return GpuTypeProfile(gpu_type=gpu_type, layers=layers)


def load_model_profile(profile_dir: Path, config_file: Path) -> ModelProfile:
    """Read `<profile_dir>/<GPU-type>/profile.json` for every GPU type, plus the config."""
    config = ModelConfig.model_validate(json.loads(config_file.read_text()))
    gpus: dict[str, GpuTypeProfile] = {}
    for sub in sorted(p for p in profile_dir.iterdir() if (p / "profile.json").is_file()):
        gpus[sub.name] = _parse_profile(sub.name, json.loads((sub / "profile.json").read_text()))
    if not gpus:
        raise FileNotFoundError(f"no <gpu>/profile.json under {profile_dir}")
    return ModelProfile(config=config, gpus=gpus)


def profile_from_data(data: Mapping[str, str], *, source: str = "profile") -> ModelProfile:
    """Parse ConfigMap-shaped data (see `CONFIG_KEY`); ValueError says what is wrong."""
    if CONFIG_KEY not in data:
        raise ValueError(f"{source} has no {CONFIG_KEY} key (the model's training config)")
    try:
        config = ModelConfig.model_validate(json.loads(data[CONFIG_KEY]))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{source}: {CONFIG_KEY} is not a valid training config: {exc}") from exc
    gpus: dict[str, GpuTypeProfile] = {}
    for key in sorted(data):
        if not (key.startswith(PROFILE_KEY_PREFIX) and key.endswith(".json")):
            continue
        gpu_type = key[len(PROFILE_KEY_PREFIX) : -len(".json")]
        try:
            gpus[gpu_type] = _parse_profile(gpu_type, json.loads(data[key]))
        except (ValueError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"{source}: {key} is not a layer-time profile: {exc}") from exc
    if not gpus:
        raise ValueError(
            f"{source} has no {PROFILE_KEY_PREFIX}<GPU type>.json key (layer times per GPU type)"
        )
    return ModelProfile(config=config, gpus=gpus)


def profile_to_data(
    profile_dir: Path, config_file: Path, gpu_names: Mapping[str, str]
) -> dict[str, str]:
    """ConfigMap data from a SAILOR profile directory, renaming its GPU types.

    `gpu_names` maps SAILOR's names (`A100-40`) to the cluster's GPU product
    label values (`A100-SXM4-40GB`); types not named are left out.
    """
    data = {CONFIG_KEY: _compact(config_file)}
    for sailor_name, product in sorted(gpu_names.items()):
        path = profile_dir / sailor_name / "profile.json"
        if not path.is_file():
            raise FileNotFoundError(f"no {path}")
        data[f"{PROFILE_KEY_PREFIX}{product}.json"] = _compact(path)
    return data


def _compact(path: Path) -> str:
    return json.dumps(json.loads(path.read_text()), separators=(",", ":"))
