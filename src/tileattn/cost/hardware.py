"""Hardware catalogue: peak rates, bandwidth and on-chip memory of real GPUs.

Every number is a :class:`Value` that carries its unit, the document it was
taken from and a *basis*:

``datasheet``
    a vendor datasheet, whitepaper or programming guide states it;
``measured``
    it was measured on a real device (``tileattn calibrate``, or a device
    property read from the driver);
``derived``
    it was computed from other values (e.g. a per-block limit from a per-SM
    limit); the source says how.

All values are stored in base SI units: FLOP/s, bytes/s, bytes, counts.
Decimal prefixes are used where the vendor uses them (bandwidth in GB/s =
1e9 B/s, HBM capacity in GB); on-chip memories follow the CUDA programming
guide, where 1 KB = 1024 bytes and 1 MB = 1024**2 bytes.

Users add hardware with a TOML or JSON file (see :func:`load_hardware_file`
and ``docs/io-model.md``); ``tileattn calibrate`` writes such a file with
``measured`` values into :func:`user_hardware_dir`.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Mapping

from .hardware_model import (  # noqa: F401  (re-exported: the catalogue's import path)
    BASES, GIGA, Hardware, KB, MB, PEAK_DTYPES, SCALAR_FIELDS, TERA, UnknownHardwareError, Value)


# ---------------------------------------------------------------------------
# The catalogue.  Source strings name the document; wording is ours.
# ---------------------------------------------------------------------------
_CUDA_GUIDE = "CUDA C++ Programming Guide, technical specifications per compute capability"


def _v(value, unit, source, basis="datasheet", note=""):
    return Value(float(value), unit, source, basis, note)


def _tf(x, source, note=""):
    return _v(x * TERA, "FLOP/s", source, note=note)


def _a100() -> Hardware:
    ds = "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column)"
    wp = "NVIDIA A100 Tensor Core GPU Architecture whitepaper (A100 configuration of GA100)"
    return Hardware(
        name="nvidia-a100-80gb-sxm4", display_name="NVIDIA A100 80GB SXM4", vendor="nvidia",
        peak_flops={
            "fp16": _tf(312, ds, "dense (without structured sparsity)"),
            "bf16": _tf(312, ds, "dense (without structured sparsity)"),
            "tf32": _tf(156, ds, "dense"),
            "fp32": _tf(19.5, ds, "FP32 is not a tensor-core format on A100: CUDA-core peak"),
        },
        hbm_bandwidth=_v(2039 * GIGA, "B/s", ds),
        memory_capacity=_v(80 * GIGA, "B", ds, note="HBM2e"),
        smem_per_sm=_v(164 * KB, "B", _CUDA_GUIDE + " (compute capability 8.0)"),
        smem_per_block=_v(163 * KB, "B", _CUDA_GUIDE + " (compute capability 8.0, opt-in maximum)"),
        sm_count=_v(108, "count", wp),
        tensor_cores=_v(432, "count", wp, note="4 third-generation tensor cores per SM"),
        l2_bytes=_v(40 * MB, "B", wp),
        interconnect_bandwidth=_v(300 * GIGA, "B/s", ds + " (NVLink: 600 GB/s) and " + wp, "derived",
                                  "third-generation NVLink, 12 links x 25 GB/s per direction; the datasheet's "
                                  "600 GB/s adds both directions"),
        interconnect_gpus=_v(8, "count", "NVIDIA HGX A100 8-GPU: six NVSwitches join the 8 GPUs", note="NVSwitch"),
        pcie_bandwidth=_v(32 * GIGA, "B/s", ds + " (PCIe Gen4: 64 GB/s)", "derived", "x16, per direction"),
    )


def _h100_common(ds: str):
    wp = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5 configuration)"
    peaks = {
        "fp16": _tf(989.4, ds, "dense; the datasheet's 1,979 TFLOPS figure assumes 2:4 sparsity"),
        "bf16": _tf(989.4, ds, "dense; the datasheet's 1,979 TFLOPS figure assumes 2:4 sparsity"),
        "tf32": _tf(494.7, ds, "dense"),
        "fp32": _tf(66.9, ds, "FP32 is not a tensor-core format: CUDA-core peak"),
        "fp8": _tf(1978.9, ds, "dense, E4M3/E5M2"),
    }
    common = dict(
        smem_per_sm=_v(228 * KB, "B", _CUDA_GUIDE + " (compute capability 9.0)"),
        smem_per_block=_v(227 * KB, "B", _CUDA_GUIDE + " (compute capability 9.0, opt-in maximum)"),
        sm_count=_v(132, "count", wp),
        tensor_cores=_v(528, "count", wp, note="4 fourth-generation tensor cores per SM"),
        interconnect_bandwidth=_v(450 * GIGA, "B/s", ds + " (NVLink: 900 GB/s) and " + wp, "derived",
                                  "fourth-generation NVLink, 18 links x 25 GB/s per direction; the datasheet's "
                                  "900 GB/s adds both directions"),
        interconnect_gpus=_v(8, "count", "NVIDIA HGX H100/H200 8-GPU: four NVSwitches join the 8 GPUs",
                             note="NVSwitch"),
        pcie_bandwidth=_v(64 * GIGA, "B/s", ds + " (PCIe Gen5: 128 GB/s)", "derived", "x16, per direction"),
    )
    return peaks, common, wp


def _h100() -> Hardware:
    ds = "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column)"
    peaks, common, wp = _h100_common(ds)
    return Hardware(
        name="nvidia-h100-sxm", display_name="NVIDIA H100 SXM5 80GB", vendor="nvidia",
        peak_flops=peaks,
        hbm_bandwidth=_v(3.35 * TERA, "B/s", ds),
        memory_capacity=_v(80 * GIGA, "B", ds, note="HBM3"),
        l2_bytes=_v(50 * MB, "B", wp),
        **common,
    )


def _h200() -> Hardware:
    ds = "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)"
    peaks, common, wp = _h100_common(ds)
    here = ("tileattn calibrate on this project's H200, 2026-11-29, torch 2.11.0+cu130 "
            "(docs/results/h200/calibrate/calibrated_h200.json)")
    return Hardware(
        name="nvidia-h200", display_name="NVIDIA H200 SXM 141GB", vendor="nvidia",
        peak_flops=peaks,
        hbm_bandwidth=_v(4.8 * TERA, "B/s", ds),
        memory_capacity=_v(141 * GIGA, "B", ds, note="HBM3e"),
        l2_bytes=_v(50 * MB, "B", wp, note="same GH100 configuration as H100 SXM5"),
        measured={
            "hbm_bandwidth": _v(4.21 * TERA, "B/s", here, "measured",
                                "1 GiB device-to-device copy, read + write bytes counted, median of 20: "
                                "4.2138 TB/s, rounded"),
            "peak_flops.bf16": _v(789 * TERA, "FLOP/s", here, "measured",
                                  "8192^3 bf16 matmul through torch.matmul, median of 20: 788.94 TFLOP/s, rounded"),
            "l2_bytes": _v(60 * MB, "B", here + ": torch.cuda.get_device_properties().L2_cache_size",
                           "measured", "the driver reports the full GH100 L2"),
        },
        **common,
    )


def _rtx4090() -> Hardware:
    wp = "NVIDIA Ada Lovelace GPU Architecture whitepaper (GeForce RTX 4090 column)"
    acc = "dense with FP32 accumulate (attention accumulates in FP32); FP16-accumulate is twice this"
    return Hardware(
        name="nvidia-rtx-4090", display_name="NVIDIA GeForce RTX 4090", vendor="nvidia",
        peak_flops={
            "fp16": _tf(165.2, wp, acc), "bf16": _tf(165.2, wp, acc),
            "tf32": _tf(82.6, wp, "dense"),
            "fp32": _tf(82.6, wp, "CUDA-core peak (not a tensor-core format)"),
            "fp8": _tf(330.3, wp, acc),
        },
        hbm_bandwidth=_v(1008 * GIGA, "B/s", wp, note="GDDR6X, not HBM; the model treats it as DRAM"),
        memory_capacity=_v(24 * GIGA, "B", wp),
        smem_per_sm=_v(100 * KB, "B", _CUDA_GUIDE + " (compute capability 8.9)"),
        smem_per_block=_v(99 * KB, "B", _CUDA_GUIDE + " (compute capability 8.9, opt-in maximum)"),
        sm_count=_v(128, "count", wp),
        tensor_cores=_v(512, "count", wp),
        l2_bytes=_v(72 * MB, "B", wp),
        pcie_bandwidth=_v(32 * GIGA, "B/s", "PCI Express 4.0 base specification: 16 GT/s per lane, 128b/130b",
                          "derived", "x16: 31.5 GB/s per direction; no NVLink on this board, peers talk over PCIe"),
    )


def _rtx3090() -> Hardware:
    wp = "NVIDIA Ampere GA102 GPU Architecture whitepaper (GeForce RTX 3090 column)"
    acc = "dense with FP32 accumulate (attention accumulates in FP32); FP16-accumulate is twice this"
    return Hardware(
        name="nvidia-rtx-3090", display_name="NVIDIA GeForce RTX 3090", vendor="nvidia",
        peak_flops={
            "fp16": _tf(71, wp, acc), "bf16": _tf(71, wp, acc),
            "tf32": _tf(35.6, wp, "dense"),
            "fp32": _tf(35.6, wp, "CUDA-core peak (not a tensor-core format)"),
        },
        hbm_bandwidth=_v(936 * GIGA, "B/s", wp, note="GDDR6X, not HBM; the model treats it as DRAM"),
        memory_capacity=_v(24 * GIGA, "B", wp),
        smem_per_sm=_v(100 * KB, "B", _CUDA_GUIDE + " (compute capability 8.6; 128 KB L1/shared combined)"),
        smem_per_block=_v(99 * KB, "B", _CUDA_GUIDE + " (compute capability 8.6, opt-in maximum)"),
        sm_count=_v(82, "count", wp),
        tensor_cores=_v(328, "count", wp),
        l2_bytes=_v(6 * MB, "B", wp),
        interconnect_bandwidth=_v(56.25 * GIGA, "B/s", wp + ", third-generation NVLink", note=(
            "four x4 links x 14.0625 GB/s per direction (112.5 GB/s both directions); needs the NVLink bridge")),
        interconnect_gpus=_v(2, "count", wp, note="the bridge joins two boards; more GPUs talk over PCIe"),
        pcie_bandwidth=_v(32 * GIGA, "B/s", "PCI Express 4.0 base specification: 16 GT/s per lane, 128b/130b",
                          "derived", "x16: 31.5 GB/s per direction"),
    )


def _mi300x() -> Hardware:
    ds = "AMD Instinct MI300X accelerator data sheet"
    wp = "AMD CDNA 3 architecture whitepaper"
    return Hardware(
        name="amd-instinct-mi300x", display_name="AMD Instinct MI300X", vendor="amd",
        peak_flops={
            "fp16": _tf(1307.4, ds, "dense matrix"), "bf16": _tf(1307.4, ds, "dense matrix"),
            "tf32": _tf(653.7, ds, "dense matrix"),
            "fp32": _tf(163.4, ds, "FP32 matrix peak"),
            "fp8": _tf(2614.9, ds, "dense matrix"),
        },
        hbm_bandwidth=_v(5.3 * TERA, "B/s", ds),
        memory_capacity=_v(192 * GIGA, "B", ds, note="HBM3"),
        smem_per_sm=_v(64 * KB, "B", wp, note="LDS per compute unit"),
        smem_per_block=_v(64 * KB, "B", wp + "; a workgroup can use the whole LDS of its CU", "derived"),
        sm_count=_v(304, "count", ds, note="compute units"),
        tensor_cores=_v(1216, "count", ds, note="matrix cores, 4 per CU"),
        l2_bytes=_v(4 * MB, "B", wp, note="per XCD; 8 XCDs, 32 MB in total, each XCD sees its own 4 MB"),
        llc_bytes=_v(256 * MB, "B", wp, note="AMD Infinity Cache, shared by all XCDs, in front of HBM"),
        interconnect_bandwidth=_v(64 * GIGA, "B/s", ds + " and " + wp + " (Infinity Fabric links)", "derived",
                                  "one x16 Infinity Fabric link per peer, 128 GB/s both directions; 7 links "
                                  "(896 GB/s) reach the 7 peers of an 8-GPU platform, so a single neighbour "
                                  "gets one link"),
        interconnect_gpus=_v(8, "count", "AMD Instinct MI300X platform: 8 GPUs, fully connected by Infinity Fabric"),
        pcie_bandwidth=_v(64 * GIGA, "B/s", ds + " (PCIe Gen5 x16: 128 GB/s)", "derived", "per direction"),
        notes=("L2 is per XCD; the 256 MB Infinity Cache is recorded as llc_bytes and not used "
               "by the L2 reuse model (conservative).",),
    )


def _build_catalogue() -> dict[str, Hardware]:
    hws = [_a100(), _h100(), _h200(), _rtx4090(), _rtx3090(), _mi300x()]
    return {h.name: h for h in hws}


CATALOGUE: dict[str, Hardware] = _build_catalogue()


# The names the drivers report for each catalogue part (torch.cuda.get_device_name:
# NVML on NVIDIA, the ROCm marketing name on AMD), compared after _device_key.
# Only the exact part: an H100 PCIe or NVL, an A100 40GB, a GH200, an RTX 4090 D
# or a laptop GPU has other bandwidth, SM counts or clocks and maps to nothing.
DEVICE_NAMES: dict[str, tuple[str, ...]] = {
    "nvidia-a100-80gb-sxm4": ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM4"),
    "nvidia-h100-sxm": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"),
    "nvidia-h200": ("NVIDIA H200", "NVIDIA H200 SXM 141GB"),
    "nvidia-rtx-4090": ("NVIDIA GeForce RTX 4090",),
    "nvidia-rtx-3090": ("NVIDIA GeForce RTX 3090",),
    "amd-instinct-mi300x": ("AMD Instinct MI300X", "AMD Instinct MI300X OAM"),
}


def _device_key(name: str) -> str:
    """A device name with case, punctuation and spacing folded: "NVIDIA A100-SXM4-80GB" -> "nvidia a100 sxm4 80gb"."""
    return " ".join("".join(ch if ch.isalnum() else " " for ch in str(name).lower()).split())


_DEVICE_KEYS = {_device_key(n): entry for entry, names in DEVICE_NAMES.items() for n in names}


def catalogue_name_for_device(device_name: str) -> str | None:
    """The catalogue entry of the device the driver reports
    (``torch.cuda.get_device_name``: "NVIDIA H100 80GB HBM3" ->
    ``nvidia-h100-sxm``), or None for any other device.  The whole name must
    be one of that part's names (:data:`DEVICE_NAMES`, case, punctuation and
    spacing aside): "NVIDIA GH200 480GB", "NVIDIA A100-SXM4-40GB" and
    "NVIDIA H100 PCIe" are other parts and give None."""
    return _DEVICE_KEYS.get(_device_key(device_name))


# ---------------------------------------------------------------------------
# User hardware files
# ---------------------------------------------------------------------------
def user_hardware_dir() -> Path:
    """Folder searched for user hardware files (``*.json`` / ``*.toml``):
    ``$TILEATTN_HARDWARE_DIR`` if set, else ``$XDG_CONFIG_HOME/tileattn/hardware``
    (``~/.config/tileattn/hardware`` when XDG_CONFIG_HOME is unset)."""
    env = os.environ.get("TILEATTN_HARDWARE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tileattn" / "hardware"


USER_DIR_HELP = ("$TILEATTN_HARDWARE_DIR, else $XDG_CONFIG_HOME/tileattn/hardware, else "
                 "~/.config/tileattn/hardware")


class HardwareFileWarning(UserWarning):
    """A file in the user hardware folder could not be loaded and was skipped."""


def _parse_value(raw: Any, field: str, unit: str, default_source: str, default_basis: str) -> Value:
    if isinstance(raw, Mapping):
        if "value" not in raw:
            raise ValueError(f"{field}: a table needs a 'value' key")
        number, unit = raw["value"], raw.get("unit", unit)
        source, basis, note = raw.get("source", default_source), raw.get("basis", default_basis), raw.get("note", "")
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
        number, source, basis, note = raw, default_source, default_basis, ""
    else:
        raise ValueError(f"{field}: expected a number or a table with 'value', got {type(raw).__name__}")
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise ValueError(f"{field}: value={number!r} must be a number")
    if not math.isfinite(number) or number <= 0:
        # peaks and bandwidths divide FLOPs and bytes; sizes and counts of 0 mean nothing either
        raise ValueError(f"{field}: value={number!r} must be a finite number > 0")
    try:
        return Value(float(number), unit, source, basis, note)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None


def hardware_from_dict(data: Mapping[str, Any], origin: str = "user file") -> Hardware:
    """Build a :class:`Hardware` from the schema written by :meth:`Hardware.as_dict`.

    Required: ``name``, ``peak_flops`` (at least one dtype), ``hbm_bandwidth``.
    A value is either a bare number (base units; source = the file, basis =
    the top-level ``basis`` key or ``datasheet``) or a table
    ``{value, source, basis, note}``; every value must be finite and > 0.
    """
    if not isinstance(data, Mapping):
        raise ValueError("hardware file must hold a table/object at the top level")
    name = data.get("name")
    if not name or not isinstance(name, str):
        raise ValueError("hardware file: 'name' (a string) is required")
    basis = data.get("basis", "datasheet")
    src = data.get("source", origin)
    peaks_raw = data.get("peak_flops")
    if not isinstance(peaks_raw, Mapping) or not peaks_raw:
        raise ValueError(f"hardware {name!r}: 'peak_flops' must map dtypes ({', '.join(PEAK_DTYPES)}) to FLOP/s")
    try:
        peaks = {}
        for k, raw in peaks_raw.items():
            if k not in PEAK_DTYPES:
                raise ValueError(f"peak_flops key {k!r} is not one of {', '.join(PEAK_DTYPES)}")
            peaks[k] = _parse_value(raw, f"peak_flops.{k}", "FLOP/s", src, basis)
        if "hbm_bandwidth" not in data:
            raise ValueError("'hbm_bandwidth' (bytes/s) is required")
        scalars = {f: _parse_value(data[f], f, unit, src, basis) for f, unit in SCALAR_FIELDS.items() if f in data}
        measured = {}
        meas_raw = data.get("measured") or {}
        if not isinstance(meas_raw, Mapping):
            raise ValueError("'measured' must be a table of field -> value")
        for k, raw in meas_raw.items():
            unit = "FLOP/s" if k.startswith("peak_flops.") else SCALAR_FIELDS.get(k)
            if unit is None or (unit == "FLOP/s" and k.split(".", 1)[1] not in PEAK_DTYPES):
                raise ValueError(f"measured key {k!r} is not a hardware field")
            measured[k] = _parse_value(raw, f"measured.{k}", unit, src, "measured")
    except ValueError as exc:
        raise ValueError(f"hardware {name!r}: {exc}") from None
    unknown = set(data) - set(SCALAR_FIELDS) - {"name", "display_name", "vendor", "peak_flops", "measured",
                                                "notes", "basis", "source"}
    if unknown:
        raise ValueError(f"hardware {name!r}: unknown keys {sorted(unknown)}")
    notes = data.get("notes", ())
    if isinstance(notes, str) or not all(isinstance(n, str) for n in notes):
        raise ValueError(f"hardware {name!r}: 'notes' must be a list of strings")
    return Hardware(name=name, display_name=str(data.get("display_name", name)),
                    vendor=str(data.get("vendor", "unknown")), peak_flops=peaks, measured=measured,
                    notes=tuple(notes), origin=origin, **scalars)


def _read_file(p: Path) -> Any:
    """The parsed contents of a hardware file (ValueError naming what is wrong, not the file)."""
    if not p.is_file():
        raise ValueError("not a file" if p.exists() else "no such file")
    text = p.read_bytes()
    if p.suffix.lower() == ".toml":
        try:
            import tomllib  # Python 3.11+
        except ModuleNotFoundError:  # pragma: no cover - 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ModuleNotFoundError as exc:
                raise ValueError("reading TOML hardware files needs Python 3.11+ or the 'tomli' package; "
                                 "use a .json file instead") from exc
        try:
            return tomllib.loads(text.decode())
        except Exception as exc:
            raise ValueError(f"invalid TOML: {exc}") from None
    if p.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"invalid JSON: {exc}") from None
    raise ValueError("expected a .json or .toml file")


def _file_entries(p: Path) -> dict[str, Hardware]:
    data = _read_file(p)
    if isinstance(data, Mapping) and "name" not in data and "hardware" in data:
        data = data["hardware"]
    items = data if isinstance(data, list) else [data]
    if not items:
        raise ValueError("holds no hardware entry")
    out: dict[str, Hardware] = {}
    for item in items:
        hw = hardware_from_dict(item, origin=str(p))
        if hw.name in out:
            raise ValueError(f"two entries are named {hw.name!r}")
        out[hw.name] = hw
    return out


def load_hardware_entries(path: str | os.PathLike) -> dict[str, Hardware]:
    """Every hardware entry of a ``.json`` or ``.toml`` file, by name.

    A file holds one entry (a table with ``name``) or several: a JSON list of
    entries, or a table whose ``hardware`` key lists them (TOML
    ``[[hardware]]``)."""
    p = Path(path)
    try:
        return _file_entries(p)
    except OSError as exc:
        raise ValueError(f"hw_file={str(p)!r}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"hw_file={str(p)!r}: {exc}") from None


def load_hardware_file(path: str | os.PathLike, name: str | None = None) -> Hardware:
    """One hardware entry of a ``.json`` or ``.toml`` file: the file's only
    entry, or the one called ``name`` (which, given, must match; a file of
    several entries needs it)."""
    entries = load_hardware_entries(path)
    names = ", ".join(entries)
    if name is None or name == "":
        if len(entries) > 1:
            raise UnknownHardwareError(f"hw_file={str(path)!r} holds {len(entries)} entries ({names}); "
                                       f"name the one to use with hw=NAME")
        return next(iter(entries.values()))
    if name not in entries:
        if len(entries) == 1:
            raise UnknownHardwareError(f"hw={name!r} does not match the name {names!r} in {path}")
        raise UnknownHardwareError(f"hw={name!r} is not an entry of {path} (its entries: {names})")
    return entries[name]


def _scan_user_hardware() -> tuple[dict[str, Hardware], dict[str, str]]:
    """(entries, {file: why it was skipped}) of :func:`user_hardware_dir`."""
    d = user_hardware_dir()
    out: dict[str, Hardware] = {}
    skipped: dict[str, str] = {}
    if d.is_dir():
        for p in sorted(d.iterdir()):
            if p.suffix.lower() in (".json", ".toml"):
                try:
                    out.update(_file_entries(p))
                except OSError as exc:
                    skipped[str(p)] = f"cannot read: {exc.strerror or exc}"
                except ValueError as exc:
                    skipped[str(p)] = str(exc)
    return out, skipped


def _warn_skipped(skipped: dict[str, str]) -> None:
    for path, why in skipped.items():
        warnings.warn(f"skipped hardware file {path}: {why}", HardwareFileWarning, stacklevel=3)


def user_hardware() -> dict[str, Hardware]:
    """Entries found in :func:`user_hardware_dir`.  A file that fails to load
    is skipped with a :class:`HardwareFileWarning` naming it and the reason
    (:func:`skipped_user_files` lists them)."""
    out, skipped = _scan_user_hardware()
    _warn_skipped(skipped)
    return out


def skipped_user_files() -> dict[str, str]:
    """Files of :func:`user_hardware_dir` that fail to load: {path: reason}."""
    return _scan_user_hardware()[1]


def hardware_names(include_user: bool = True) -> list[str]:
    names = set(CATALOGUE)
    if include_user:
        names |= set(user_hardware())
    return sorted(names)


def get_hardware(name: str | None = None, hw_file: str | os.PathLike | None = None) -> Hardware:
    """Look up hardware by name.

    With ``hw_file`` the file is loaded: its only entry, or the one called
    ``name`` (:func:`load_hardware_file`).  Otherwise ``name`` is searched in
    the user folder first (so a calibrated entry can shadow a catalogue one)
    and then in the catalogue.  Unknown names raise
    :class:`UnknownHardwareError` (a ``ValueError``) that lists the valid
    names and any user file that was skipped.
    """
    if hw_file is not None:
        return load_hardware_file(hw_file, name)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"hw={name!r} must be a hardware name (str), not {type(name).__name__}")
    users, skipped = _scan_user_hardware()
    _warn_skipped(skipped)
    valid = ", ".join(sorted(set(CATALOGUE) | set(users)))
    if not name:
        raise UnknownHardwareError("hw: a hardware name is required; valid names: " + valid)
    if name in users:
        return users[name]
    if name in CATALOGUE:
        return CATALOGUE[name]
    bad = "".join(f"; skipped {path}: {why}" for path, why in skipped.items())
    raise UnknownHardwareError(f"unknown hardware {name!r}; valid names: {valid} "
                               f"(or pass a TOML/JSON file with --hw-file){bad}")
