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
import os
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
    here = "measured on this project's H200 (2026-11)"
    return Hardware(
        name="nvidia-h200", display_name="NVIDIA H200 SXM 141GB", vendor="nvidia",
        peak_flops=peaks,
        hbm_bandwidth=_v(4.8 * TERA, "B/s", ds),
        memory_capacity=_v(141 * GIGA, "B", ds, note="HBM3e"),
        l2_bytes=_v(50 * MB, "B", wp, note="same GH100 configuration as H100 SXM5"),
        measured={
            "hbm_bandwidth": _v(4.3 * TERA, "B/s", here, "measured",
                                "device-to-device copy, read + write bytes counted"),
            "peak_flops.bf16": _v(790 * TERA, "FLOP/s", here, "measured",
                                  "large bf16 matmul through torch.matmul"),
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


def catalogue_name_for_device(device_name: str) -> str | None:
    """The catalogue entry whose model (the first part of its name after the
    vendor that holds a digit: ``h100``, ``4090``, ``mi300x``) appears in a
    device name as the driver reports it (``torch.cuda.get_device_name``:
    "NVIDIA H100 80GB HBM3" -> ``nvidia-h100-sxm``), or None."""
    flat = str(device_name).lower().replace(" ", "")
    for key in CATALOGUE:
        model = next((t for t in key.split("-")[1:] if any(ch.isdigit() for ch in t)), None)
        if model and model in flat:
            return key
    return None


# ---------------------------------------------------------------------------
# User hardware files
# ---------------------------------------------------------------------------
def user_hardware_dir() -> Path:
    """Folder searched for user hardware files (``*.json`` / ``*.toml``):
    ``$TILEATTN_HARDWARE_DIR`` if set, else ``~/.config/tileattn/hardware``."""
    env = os.environ.get("TILEATTN_HARDWARE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tileattn" / "hardware"


def _parse_value(raw: Any, field: str, unit: str, default_source: str, default_basis: str) -> Value:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return Value(float(raw), unit, default_source, default_basis)
    if isinstance(raw, Mapping):
        if "value" not in raw:
            raise ValueError(f"{field}: a table needs a 'value' key")
        return Value(float(raw["value"]), raw.get("unit", unit), raw.get("source", default_source),
                     raw.get("basis", default_basis), raw.get("note", ""))
    raise ValueError(f"{field}: expected a number or a table with 'value', got {type(raw).__name__}")


def hardware_from_dict(data: Mapping[str, Any], origin: str = "user file") -> Hardware:
    """Build a :class:`Hardware` from the schema written by :meth:`Hardware.as_dict`.

    Required: ``name``, ``peak_flops`` (at least one dtype), ``hbm_bandwidth``.
    A value is either a bare number (base units; source = the file, basis =
    the top-level ``basis`` key or ``datasheet``) or a table
    ``{value, source, basis, note}``.
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
    peaks = {}
    for k, raw in peaks_raw.items():
        if k not in PEAK_DTYPES:
            raise ValueError(f"hardware {name!r}: peak_flops key {k!r} is not one of {', '.join(PEAK_DTYPES)}")
        peaks[k] = _parse_value(raw, f"peak_flops.{k}", "FLOP/s", src, basis)
    if "hbm_bandwidth" not in data:
        raise ValueError(f"hardware {name!r}: 'hbm_bandwidth' (bytes/s) is required")
    scalars = {f: _parse_value(data[f], f, unit, src, basis) for f, unit in SCALAR_FIELDS.items() if f in data}
    measured = {}
    for k, raw in (data.get("measured") or {}).items():
        unit = "FLOP/s" if k.startswith("peak_flops.") else SCALAR_FIELDS.get(k)
        if unit is None:
            raise ValueError(f"hardware {name!r}: measured key {k!r} is not a hardware field")
        measured[k] = _parse_value(raw, f"measured.{k}", unit, src, "measured")
    unknown = set(data) - set(SCALAR_FIELDS) - {"name", "display_name", "vendor", "peak_flops", "measured",
                                                "notes", "basis", "source"}
    if unknown:
        raise ValueError(f"hardware {name!r}: unknown keys {sorted(unknown)}")
    return Hardware(name=name, display_name=data.get("display_name", name), vendor=data.get("vendor", "unknown"),
                    peak_flops=peaks, measured=measured, notes=tuple(data.get("notes", ())), origin=origin,
                    **scalars)


def load_hardware_file(path: str | os.PathLike) -> Hardware:
    """Load one hardware entry from a ``.json`` or ``.toml`` file."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"hw_file={str(p)!r}: no such file")
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
            data = tomllib.loads(text.decode())
        except Exception as exc:
            raise ValueError(f"hw_file={str(p)!r}: invalid TOML: {exc}") from None
    elif p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"hw_file={str(p)!r}: invalid JSON: {exc}") from None
    else:
        raise ValueError(f"hw_file={str(p)!r}: expected a .json or .toml file")
    return hardware_from_dict(data, origin=str(p))


def user_hardware() -> dict[str, Hardware]:
    """Entries found in :func:`user_hardware_dir` (files that fail to load are skipped)."""
    d = user_hardware_dir()
    out: dict[str, Hardware] = {}
    if d.is_dir():
        for p in sorted(d.iterdir()):
            if p.suffix.lower() in (".json", ".toml"):
                try:
                    hw = load_hardware_file(p)
                except ValueError:
                    continue
                out[hw.name] = hw
    return out


def hardware_names(include_user: bool = True) -> list[str]:
    names = set(CATALOGUE)
    if include_user:
        names |= set(user_hardware())
    return sorted(names)


def get_hardware(name: str | None = None, hw_file: str | os.PathLike | None = None) -> Hardware:
    """Look up hardware by name.

    With ``hw_file`` the file is loaded (and, if ``name`` is given, its name
    must match).  Otherwise ``name`` is searched in the user folder first
    (so a calibrated entry can shadow a catalogue one) and then in the
    catalogue.  Unknown names raise :class:`UnknownHardwareError` (a
    ``ValueError``) that lists the valid names.
    """
    if hw_file is not None:
        hw = load_hardware_file(hw_file)
        if name and name != hw.name:
            raise UnknownHardwareError(f"hw={name!r} does not match the name {hw.name!r} in {hw_file}")
        return hw
    if not name:
        raise UnknownHardwareError("hw: a hardware name is required; valid names: " + ", ".join(hardware_names()))
    users = user_hardware()
    if name in users:
        return users[name]
    if name in CATALOGUE:
        return CATALOGUE[name]
    raise UnknownHardwareError(f"unknown hardware {name!r}; valid names: {', '.join(hardware_names())} "
                               f"(or pass a TOML/JSON file with --hw-file)")
