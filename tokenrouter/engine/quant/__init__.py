"""What a GGUF holds and how it is computed: its tensors read as blocks or dense, the linear
kernels that compute on them (the GGUF block kernels, oneDNN, int8, int4), the kernel cache, and
the probes and precision rule that choose between them for this machine."""

from .gguf_blocks import GGUFBlockLinear
from .gguf_fused import FusedLinears, rope
from .gguf_index import tensor_places
from .gguf_native import LayerArgs
from .gguf_weights import GGUFTensor, GGUFWeights, dequantized, main_kind, q4k_groups
from .kernels import gguf_sourced, prepare_linears
from .precision import GGUF_MODES, Precision, meta_model, resolve_precision
from .prefix_head import PrefixHead, narrow_head
from .probe_cache import clear_probes, list_probes, probe_dir

__all__ = ["GGUFTensor", "GGUFWeights", "dequantized", "main_kind", "q4k_groups", "tensor_places", "GGUF_MODES"]
__all__ += ["Precision", "gguf_sourced", "meta_model", "prepare_linears", "resolve_precision", "clear_probes"]
__all__ += ["list_probes", "probe_dir"]
__all__ += ["GGUFBlockLinear", "FusedLinears", "LayerArgs", "rope"]
__all__ += ["PrefixHead", "narrow_head"]
