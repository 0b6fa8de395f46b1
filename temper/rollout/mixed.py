"""One forward over many requests at once: decode rows and prefill chunks of different requests, each
with its own KV cache, in a single pass through the model (vLLM-style mixed batches, on CPU).

Why: on the small models temper serves on CPU a forward's cost is mostly fixed per-layer overhead,
not tokens. Run one forward per request and a stream of long prefills competes with short
requests for whole forwards: the long lane gets only the time short requests leave idle, and every
forward it takes delays them. Run them together and the token-parallel work (norms, projections,
MLP) of every request is one matrix product over all their tokens; only attention is per request
(each against its own cache). A long prefill chunk then rides along with the short requests'
decode steps at a small marginal cost, and progresses every forward.

How: the flat token layout of vLLM. Every segment (one request's rows x tokens this forward) is
laid end to end into one [tokens, hidden] matrix; norms, q/k/v/o projections and the MLP run once
over it; rotary embeddings use each token's own position; each segment's keys and values are
appended to its own cache and its queries attend over that cache with
``scaled_dot_product_attention`` (causal within a prefill chunk). Numerically this is the model's
own forward up to float rounding (checked against ``model(...)`` in tests).

Supported: decoder layers built like Llama's (pre-norm, ``self_attn`` with q/k/v/o projections,
rotary embeddings, an MLP) with full attention: Llama, Mistral and Qwen2 families
(``supports``). Other models use the per-request path in ``engine.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

import torch
import torch.nn.functional as F

_SUPPORTED = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}


def supports(model) -> bool:
    """True when ``mixed_forward`` reproduces this model's forward (see the module docstring)."""
    return type(model).__name__ in _SUPPORTED  # sliding-window configs are refused by the engine itself


@dataclass
class Segment:
    """One request's share of a forward: ``rows`` x ``len(tokens[0])`` new tokens appended to ``cache``
    at positions ``start ..``; ``want_logits``: return the last position's logits of every row, or with
    ``every_position`` the logits of every new token (a speculative verify, ``lookup.py``)."""

    cache: Any
    tokens: list[list[int]]  # [rows][t]
    start: int
    want_logits: bool = True
    every_position: bool = False


def _rotary(model):
    """The model family's own ``apply_rotary_pos_emb`` (from its modeling module)."""
    return import_module(type(model).__module__).apply_rotary_pos_emb


@torch.no_grad()
def mixed_forward(model, segments: list[Segment]) -> list[torch.Tensor | None]:
    """Run every segment in one pass; per segment, logits [rows, vocab] of each row's last token (or None)."""
    inner = model.model
    device = inner.embed_tokens.weight.device
    shapes = [(len(s.tokens), len(s.tokens[0])) for s in segments]
    ids = torch.tensor([t for s in segments for row in s.tokens for t in row], device=device)
    pos = torch.cat([torch.arange(s.start, s.start + t).repeat(r) for s, (r, t) in zip(segments, shapes)]).to(device)
    h = inner.embed_tokens(ids).unsqueeze(0)  # [1, N, hidden]
    cos, sin = inner.rotary_emb(h, position_ids=pos.unsqueeze(0))
    cos, sin = cos[0], sin[0]  # [N, head_dim]
    apply_rotary = _rotary(model)
    bounds, at = [], 0
    for r, t in shapes:
        bounds.append((at, at + r * t))
        at += r * t
    masks = [_chunk_mask(s, t, device) for s, (_, t) in zip(segments, shapes)]
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        hd = attn.head_dim
        x = layer.input_layernorm(h)[0]
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        outs = []
        for s, (r, t), (lo, hi), mask in zip(segments, shapes, bounds, masks):
            qs = q[lo:hi].view(r, t, -1, hd).transpose(1, 2)
            ks = k[lo:hi].view(r, t, -1, hd).transpose(1, 2)
            vs = v[lo:hi].view(r, t, -1, hd).transpose(1, 2)
            c, sn = cos[lo:hi].view(r, t, hd), sin[lo:hi].view(r, t, hd)
            qs, ks = apply_rotary(qs, ks, c, sn)
            keys, values = s.cache.layers[i].update(ks, vs)
            o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask, scale=attn.scaling,
                                               enable_gqa=qs.shape[1] != keys.shape[1])
            outs.append(o.transpose(1, 2).reshape(r * t, -1))
        h = h + attn.o_proj(torch.cat(outs)).unsqueeze(0)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    last, counts = [], []
    for s, (r, t), (lo, hi) in zip(segments, shapes, bounds):
        wanted = [] if not s.want_logits else range(lo, hi) if s.every_position else \
            [lo + (row + 1) * t - 1 for row in range(r)]
        last.extend(wanted)
        counts.append(len(wanted))
    if not last:
        return [None] * len(segments)
    logits = model.lm_head(inner.norm(h[0, last]))
    out: list[torch.Tensor | None] = []
    at = 0
    for s, n in zip(segments, counts):
        out.append(logits[at:at + n] if s.want_logits else None)
        at += n
    return out


def _chunk_mask(s: Segment, t: int, device: torch.device) -> torch.Tensor | None:
    """Causal mask of a chunk of ``t`` new tokens after ``s.start`` cached ones (None for one token)."""
    if t == 1:
        return None
    keys = torch.arange(s.start + t, device=device)
    return keys.unsqueeze(0) <= (s.start + torch.arange(t, device=device)).unsqueeze(1)  # [t, start + t]
