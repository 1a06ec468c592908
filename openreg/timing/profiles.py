"""Device profiles: what the timing model knows of an accelerator, from its published figures.

A profile is a small file (JSON, or TOML on Python 3.11+) a vendor can write for its chip; the
built-in ones are such files in ``openreg/timing/data``. Fields (units in the names):

* ``name``, ``description``; ``compute_units`` (SMs, CUs: for wave quantization of matrix products);
* ``matrix_tflops`` and ``vector_tflops``: peak dense TFLOPS per data type of the matrix (tensor)
  units and of the vector units; keys from :data:`DTYPES`;
* ``memory_gib``, ``memory_bandwidth_gbs``;
* ``host_link``: ``pinned_gbs`` and ``pageable_gbs``, per direction;
* ``interconnect``: ``bandwidth_gbs`` per direction per device, optional ``latency_us`` (per step);
* ``cache``: optional ``l2_mib``, the last-level cache a kernel's working set may stay in;
* optional ``special_tops``: the special-function units' rate (exponentials, tera-ops per second) that
  attention's softmax runs at (default: the float32 vector peak / 16, NVIDIA's 16 per SM per clock
  beside 128 FMA lanes);
* optional ``memory_latency_us`` and ``l2_latency_us``: a load's latency from memory and from L2 (for
  kernels whose small grid cannot hide it);
* optional ``launch_latency_us``, ``kernel_floor_us``, ``matrix_overhead_us``, ``efficiency`` (overrides of
  :data:`.model.EFFICIENCY`), ``host_us`` (the host's issue cost per launch, overrides of
  :data:`.model.HOST_US`) and ``scratch`` (overrides of :data:`.model.SCRATCH`);
* ``sources``: where each figure comes from (free text per field; shown by the docs).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ErrorCode, OpenRegError
from . import model

DATA = Path(__file__).with_name("data")
DTYPES = ("float64", "float32", "tfloat32", "bfloat16", "float16", "float8", "int8")


@dataclass(frozen=True)
class DeviceProfile:
    """An accelerator as the timing model sees it (see the module docstring for the fields)."""

    name: str
    description: str
    compute_units: int
    matrix_tflops: Mapping[str, float]
    vector_tflops: Mapping[str, float]
    memory_gib: float
    memory_bandwidth_gbs: float
    host_pinned_gbs: float
    host_pageable_gbs: float
    interconnect_gbs: float
    launch_latency_us: float = model.LAUNCH_LATENCY_US
    kernel_floor_us: float = model.KERNEL_FLOOR_US
    matrix_overhead_us: float = model.MATRIX_OVERHEAD_US
    memory_latency_us: float = model.MEMORY_LATENCY_US
    l2_latency_us: float = model.L2_LATENCY_US
    special_function_tops: float = 0.0  # 0: derived from the vector peak (see special_tops)
    l2_cache_mib: float = 0.0
    host_us: Mapping[str, float] = field(default_factory=lambda: dict(model.HOST_US))
    scratch: Mapping[str, float] = field(default_factory=lambda: dict(model.SCRATCH))
    collective_latency_us: float = model.COLLECTIVE_LATENCY_US
    efficiency: Mapping[str, float] = field(default_factory=lambda: dict(model.EFFICIENCY))
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * (1 << 30))

    @property
    def special_tops(self) -> float:
        """Exponentials per second / 1e12 of the special-function units (16 per SM per clock on NVIDIA
        GPUs since Volta, beside 128 FP32 lanes, 256 FLOPs per clock: the float32 peak / 16)."""
        return self.special_function_tops or self.vector_tflops["float32"] / 16

    def peak_flops(self, dtype: str, matrix: bool) -> float:
        """Peak FLOP/s for ``dtype``: the matrix units' for a matrix product or convolution when they
        handle that type, else the vector units' (float32's for a type the vector units do not list)."""
        if matrix and dtype in self.matrix_tflops:
            return self.matrix_tflops[dtype] * 1e12
        if dtype in self.vector_tflops:
            return self.vector_tflops[dtype] * 1e12
        if dtype == "tfloat32" and "float32" in self.vector_tflops:
            return self.vector_tflops["float32"] * 1e12
        return self.vector_tflops["float32"] * 1e12


# LITERALINCLUDE START: PROFILE PARSE
def from_dict(data: Mapping, origin: str = "profile") -> DeviceProfile:
    """Check a profile's fields and build it; a bad or missing field raises INVALID_VALUE naming it."""

    def fail(name: str, why: str) -> OpenRegError:
        return OpenRegError(ErrorCode.INVALID_VALUE, f"{origin}: field '{name}' {why}")

    def number(table: Mapping, name: str, prefix: str = "", required: bool = True, integer: bool = False,
               zero: bool = False):
        full = prefix + name
        if name not in table:
            if required:
                raise fail(full, "is missing")
            return None
        value = table[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
                or (value == 0 and not zero):
            raise fail(full, f"must be a {'non-negative' if zero else 'positive'} number, got {value!r}")
        if integer and int(value) != value:
            raise fail(full, f"must be a whole number, got {value!r}")
        return int(value) if integer else float(value)

    def table(name: str, required: bool = True) -> Mapping:
        value = data.get(name, None if required else {})
        if not isinstance(value, Mapping):
            raise fail(name, "is missing" if value is None else f"must be a table, got {value!r}")
        return value

    if not isinstance(data, Mapping):
        raise OpenRegError(ErrorCode.INVALID_VALUE,
                           f"{origin}: a profile is a table of fields, got {type(data).__name__}")
    known = {"name", "description", "compute_units", "matrix_tflops", "vector_tflops", "memory_gib",
             "memory_bandwidth_gbs", "host_link", "interconnect", "launch_latency_us", "efficiency", "sources",
             "cache", "kernel_floor_us", "host_us", "scratch", "matrix_overhead_us", "special_tops",
             "memory_latency_us", "l2_latency_us"}
    for name in data:
        if name not in known:
            raise fail(name, f"is not a profile field (fields: {', '.join(sorted(known))})")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise fail("name", f"must be a non-empty string, got {name!r}")
    peaks = {}
    for group in ("matrix_tflops", "vector_tflops"):
        values = table(group, required=group == "vector_tflops")
        for dtype in values:
            if dtype not in DTYPES:
                raise fail(f"{group}.{dtype}", f"is not a data type (data types: {', '.join(DTYPES)})")
        peaks[group] = {dtype: number(values, dtype, f"{group}.") for dtype in values}
    if "float32" not in peaks["vector_tflops"]:
        raise fail("vector_tflops.float32", "is missing")
    link, net, eff = table("host_link"), table("interconnect"), table("efficiency", required=False)
    efficiency = dict(model.EFFICIENCY)
    for kind in eff:
        if kind not in efficiency:
            raise fail(f"efficiency.{kind}", f"is not a kernel class (classes: {', '.join(efficiency)})")
        efficiency[kind] = number(eff, kind, "efficiency.")
    tables = {}
    for group, defaults in (("host_us", model.HOST_US), ("scratch", model.SCRATCH)):
        values, tables[group] = table(group, required=False), dict(defaults)
        for key in values:
            if key not in defaults:
                raise fail(f"{group}.{key}", f"is not one of {', '.join(defaults)}")
            tables[group][key] = number(values, key, f"{group}.", zero=True)
    cache = table("cache", required=False)
    for key in cache:
        if key != "l2_mib":
            raise fail(f"cache.{key}", "is not a cache field (fields: l2_mib)")
    sources = data.get("sources", {})
    if not isinstance(sources, Mapping) or not all(isinstance(v, str) for v in sources.values()):
        raise fail("sources", "must be a table of strings")
    description = data.get("description", name)
    if not isinstance(description, str):
        raise fail("description", f"must be a string, got {description!r}")
    return DeviceProfile(
        name=name.strip(),
        description=description,
        compute_units=number(data, "compute_units", integer=True),
        matrix_tflops=peaks["matrix_tflops"],
        vector_tflops=peaks["vector_tflops"],
        memory_gib=number(data, "memory_gib"),
        memory_bandwidth_gbs=number(data, "memory_bandwidth_gbs"),
        host_pinned_gbs=number(link, "pinned_gbs", "host_link."),
        host_pageable_gbs=number(link, "pageable_gbs", "host_link."),
        interconnect_gbs=number(net, "bandwidth_gbs", "interconnect."),
        launch_latency_us=number(data, "launch_latency_us", required=False) or model.LAUNCH_LATENCY_US,
        collective_latency_us=number(net, "latency_us", "interconnect.", required=False)
        or model.COLLECTIVE_LATENCY_US,
        kernel_floor_us=_given(number(data, "kernel_floor_us", required=False, zero=True), model.KERNEL_FLOOR_US),
        matrix_overhead_us=_given(number(data, "matrix_overhead_us", required=False, zero=True),
                                  model.MATRIX_OVERHEAD_US),
        special_function_tops=_given(number(data, "special_tops", required=False), 0.0),
        memory_latency_us=_given(number(data, "memory_latency_us", required=False), model.MEMORY_LATENCY_US),
        l2_latency_us=_given(number(data, "l2_latency_us", required=False), model.L2_LATENCY_US),
        l2_cache_mib=_given(number(cache, "l2_mib", "cache.", required=False, zero=True), 0.0),
        host_us=tables["host_us"],
        scratch=tables["scratch"],
        efficiency=efficiency,
        sources=dict(sources),
    )
# LITERALINCLUDE END: PROFILE PARSE


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def load_file(path: str | os.PathLike) -> DeviceProfile:
    """A profile from a ``.json`` or ``.toml`` file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise OpenRegError(ErrorCode.INVALID_VALUE, f"cannot read device profile {str(path)!r}: {exc}") from None
    try:
        if path.suffix == ".toml":
            import tomllib  # Python 3.11+

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ImportError:
        raise OpenRegError(ErrorCode.NOT_SUPPORTED, f"{path}: TOML profiles need Python 3.11+; use JSON") from None
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError both are
        raise OpenRegError(ErrorCode.INVALID_VALUE, f"{path} is not valid {path.suffix[1:] or 'JSON'}: {exc}") from None
    return from_dict(data, str(path))


_builtin: dict[str, DeviceProfile] = {}


def builtin() -> dict[str, DeviceProfile]:
    """The built-in profiles by name (read once)."""
    if not _builtin:
        for path in sorted(DATA.glob("*.json")):
            if path.stem != "measurements" and not path.stem.endswith(("-calibration", "-traces")):
                profile = load_file(path)
                _builtin[profile.name] = profile
    return dict(_builtin)


def resolve(spec: str | os.PathLike | Mapping | DeviceProfile) -> DeviceProfile:
    """A profile from a built-in name, a file path, a dict of fields or a profile."""
    if isinstance(spec, DeviceProfile):
        return spec
    if isinstance(spec, Mapping):
        return from_dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        known = builtin()
        if text in known:
            return known[text]
        if text.endswith((".json", ".toml")) or os.sep in text:
            return load_file(text)
        raise OpenRegError(
            ErrorCode.INVALID_VALUE,
            f"unknown device profile {text!r}; known profiles: {', '.join(sorted(known))} "
            "(or the path of a .json or .toml profile file)",
        )
    raise OpenRegError(ErrorCode.INVALID_VALUE, f"a device profile is a name, a file path or a dict, got {spec!r}")


def to_dict(profile: DeviceProfile) -> dict:
    """A profile's fields as a profile file holds them (:func:`from_dict` reads it back)."""
    return {
        "name": profile.name, "description": profile.description, "compute_units": profile.compute_units,
        "matrix_tflops": dict(profile.matrix_tflops), "vector_tflops": dict(profile.vector_tflops),
        "memory_gib": profile.memory_gib, "memory_bandwidth_gbs": profile.memory_bandwidth_gbs,
        "host_link": {"pinned_gbs": profile.host_pinned_gbs, "pageable_gbs": profile.host_pageable_gbs},
        "interconnect": {"bandwidth_gbs": profile.interconnect_gbs, "latency_us": profile.collective_latency_us},
        **({"cache": {"l2_mib": profile.l2_cache_mib}} if profile.l2_cache_mib else {}),
        "launch_latency_us": profile.launch_latency_us, "kernel_floor_us": profile.kernel_floor_us,
        "matrix_overhead_us": profile.matrix_overhead_us, "memory_latency_us": profile.memory_latency_us,
        "l2_latency_us": profile.l2_latency_us,
        **({"special_tops": profile.special_function_tops} if profile.special_function_tops else {}),
        "efficiency": dict(profile.efficiency), "host_us": dict(profile.host_us), "scratch": dict(profile.scratch),
        "sources": dict(profile.sources),
    }
