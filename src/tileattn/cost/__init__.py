"""IO cost model of attention: FLOPs, HBM bytes, roofline, tile shapes, hardware;
``decode.py``: the same for one KV-cache decoding step.

Plain functions on shapes, no GPU needed.  ``docs/io-model.md`` derives the
formulas; ``benchmarks/measure_bytes.py`` checks them against Nsight Compute.
"""
from .decode import DecodeShape, crossover_heads, decode_bound, decode_cache_bytes, decode_flops, decode_traffic
from .hardware import (CATALOGUE, Hardware, HardwareFileWarning, UnknownHardwareError, Value, get_hardware,
                       hardware_from_dict, hardware_names, load_hardware_entries, load_hardware_file,
                       user_hardware_dir)
from .io import (AttentionShape, CacheModel, DefaultConfigs, FlopBreakdown, Pass, ResidentMemory, TrafficEstimate,
                 attention_flops, cache_model, default_configs, dtype_bytes, executed_pairs, flop_breakdown,
                 parse_config_name, resident_memory, standard_traffic, tiled_traffic, visible_pairs)
from .roofline import Comparison, PhasePrediction, compare, peak_dtype, predict
from .shape import KernelFit, kernel_fits
from .tiles import (TileOption, chosen_configs, feasible_tiles, kernel_bytes, max_block_n, paper_block_sizes,
                    table_configs_check)

__all__ = [
    "DecodeShape", "crossover_heads", "decode_bound", "decode_cache_bytes", "decode_flops", "decode_traffic",
    "CATALOGUE", "Hardware", "HardwareFileWarning", "UnknownHardwareError", "Value", "get_hardware",
    "hardware_from_dict", "hardware_names", "load_hardware_entries", "load_hardware_file", "user_hardware_dir",
    "AttentionShape", "CacheModel", "DefaultConfigs", "FlopBreakdown", "Pass", "ResidentMemory", "TrafficEstimate",
    "attention_flops", "cache_model", "default_configs", "dtype_bytes", "executed_pairs", "flop_breakdown",
    "parse_config_name", "resident_memory", "standard_traffic", "tiled_traffic", "visible_pairs",
    "Comparison", "PhasePrediction", "compare", "peak_dtype", "predict", "KernelFit", "kernel_fits",
    "TileOption", "chosen_configs", "feasible_tiles", "kernel_bytes", "max_block_n", "paper_block_sizes",
    "table_configs_check",
]
