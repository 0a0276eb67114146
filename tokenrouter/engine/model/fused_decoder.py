"""A Llama-style model's forward on the GGUF block kernels in a handful of C calls per layer.

transformers' decoder layer is about forty torch ops and module calls around its seven matmuls;
on the demo 1.5B, with the matmuls in the block kernels, they took a quarter of a decode step
(12 of 47 ms), where llama.cpp's whole step is 38. Here each layer is five calls: RMSNorm and q,
k, v in one (`FusedLinears`), the rotary product in place, attention (the engine's backend), o
plus the residual, RMSNorm and SiLU(gate) * up in one, down plus the residual; then the final
RMSNorm and the output head in one. It computes what
transformers' layer computes, reading the same modules' weights: the same bits but for RMSNorm's
sum (in double here) and SiLU's exp (tests/engine/model/test_fused_decoder.py states the
tolerance). Every op takes each row alone, so a token's logits are the same bits in a step of
any rows, which lossless speculation needs.

It serves where every linear of every layer is a GGUF block linear (at any CPU level),
the model computes in float32 on the CPU, and the architecture is one it knows (`ARCHS`); the
runner falls back to transformers' forward otherwise, and `TOKENROUTER_FUSED_LAYERS=off` does
so on purpose. With the C attention kernel the layers run as one C call a step (layer_stack.py,
the same bits); `TOKENROUTER_FUSED_LAYERS=python` keeps the loop below.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..attention import AttentionBackend, AttentionMetadata
from ..quant import FusedLinears, GGUFBlockLinear, rope
from .layer_stack import LayerStack

ENV = "TOKENROUTER_FUSED_LAYERS"
ARCHS = frozenset({"qwen2", "llama", "mistral"})  # RMSNorm, rotate-half rotary, SiLU-gated MLP, no q/k norm


@dataclass
class FusedLayer:
    qkv: FusedLinears  # RMSNorm(x), then q | k | v side by side
    o: FusedLinears  # h += attention @ o
    gate_up: FusedLinears  # SiLU(RMSNorm(h) @ gate) * (RMSNorm(h) @ up)
    down: FusedLinears  # h += that @ down
    sliding_window: int | None


class FusedDecoder:
    """The forward of `model` (a transformers causal LM) as fused calls; build with `of`."""

    def __init__(self, model: torch.nn.Module, layers: list[FusedLayer]):
        text = model.config.get_text_config()
        self.model = model
        self.layers = layers
        self.embed = model.get_input_embeddings()
        self.rotary = model.model.rotary_emb
        self.final_norm = model.model.norm
        self.head = model.get_output_embeddings()
        # the final RMSNorm in the head's call where the head is a block linear too (0.13 ms of torch
        # ops a step less on the demo 1.5B); else transformers' norm, then the head
        self.normed_head = None
        if isinstance(self.head, GGUFBlockLinear) and self.head.bias is None:
            norm = self.final_norm
            self.normed_head = FusedLinears([self.head], "store", norm.weight, norm.variance_epsilon)
        self.heads, self.kv_heads = text.num_attention_heads, text.num_key_value_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // self.heads
        self.scaling = self.head_dim**-0.5
        self.lib = layers[0].qkv.lib
        self.in_c = os.environ.get(ENV, "").lower() != "python"  # the layers as one C call where it can
        self._stack: tuple[AttentionBackend, LayerStack | None] | None = None  # built for the first backend seen

    @classmethod
    def of(cls, model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> tuple[FusedDecoder | None, str]:
        """(the fused forward, "") where it can serve `model`, else (None, why not)."""
        if os.environ.get(ENV, "").lower() in ("0", "off", "no", "false"):
            return None, f"{ENV}={os.environ[ENV]}"
        text = model.config.get_text_config()
        if text.model_type not in ARCHS:
            return None, f"{text.model_type} is not one of {sorted(ARCHS)}"
        if device.type != "cpu" or dtype != torch.float32:
            return None, f"computes in {dtype} on {device.type} (float32 on the CPU only)"
        if getattr(text, "hidden_act", "silu") != "silu" or getattr(text, "mlp_bias", False):
            return None, "its MLP is not SiLU-gated without bias"
        layers = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            linears = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
            if not all(isinstance(m, GGUFBlockLinear) for m in linears):
                return None, "not every linear layer is a GGUF block linear"
            if getattr(attn, "q_norm", None) is not None or getattr(attn, "o_proj").bias is not None:
                return None, "its attention has a q/k norm or an output bias"
            window = getattr(attn, "sliding_window", None)
            if text.model_type == "mistral":
                window = getattr(text, "sliding_window", None)
            ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
            layers.append(
                FusedLayer(
                    qkv=FusedLinears(linears[:3], "store", ln1.weight, ln1.variance_epsilon),
                    o=FusedLinears(linears[3:4], "add"),
                    gate_up=FusedLinears(linears[4:6], "silu_mul", ln2.weight, ln2.variance_epsilon),
                    down=FusedLinears(linears[6:7], "add"),
                    sliding_window=window,
                )
            )
        if not layers:
            return None, "it has no layers"
        return cls(model, layers), ""

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        backend: AttentionBackend,
        meta: AttentionMetadata,
        keep: torch.Tensor | int,
    ) -> torch.Tensor:
        """Logits [rows kept, vocab] for a packed step (`input_ids`, `positions` [T]), as
        transformers' forward with `logits_to_keep=keep` (0: every row) gives them."""
        h = self.embed(input_ids).float().contiguous()
        cos, sin = self.rotary(h[None], positions[None])
        cos, sin = cos[0].float().contiguous(), sin[0].float().contiguous()
        stack = self.stack(backend)
        if stack is not None:
            stack(h, cos, sin, meta)
        else:
            self.layers_in_python(h, cos, sin, backend, meta)
        if not (isinstance(keep, int) and keep == 0):
            h = h[keep] if isinstance(keep, torch.Tensor) else h[-keep:]
        if self.normed_head is not None:
            return self.normed_head(h.contiguous())
        return self.head(self.final_norm(h))

    def stack(self, backend: AttentionBackend) -> LayerStack | None:
        """The layers as one C call over `backend` (None: the Python loop serves)."""
        if not self.in_c:
            return None
        if self._stack is None or self._stack[0] is not backend:
            heads = (self.heads, self.kv_heads, self.head_dim)
            self._stack = (backend, LayerStack.over(self.lib, self.layers, backend, *heads, self.scaling))
        return self._stack[1]

    def layers_in_python(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend, meta: AttentionMetadata
    ) -> None:
        """h through every layer, in place, a few calls a layer (any attention backend)."""
        t = h.shape[0]
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(h)
            rope(self.lib, qkv, self.heads + self.kv_heads, self.head_dim, cos, sin)
            q = qkv[:, :q_width].view(t, self.heads, self.head_dim)
            k = qkv[:, q_width : q_width + kv_width].view(t, self.kv_heads, self.head_dim)
            v = qkv[:, q_width + kv_width :].view(t, self.kv_heads, self.head_dim)
            attn = backend.forward(i, q, k, v, meta, self.scaling, layer.sliding_window)
            layer.o(attn.reshape(t, q_width).contiguous(), out=h)
            layer.down(layer.gate_up(h), out=h)
