"""Decode steps as one static forward over a KV slot pool, replayed as a CUDA graph on GPUs.

Why: on a GPU a decode step of a ~1B model is launch-bound, not compute-bound. transformers'
``generate`` spends ~10 ms a step at batch 16 on an H200 launching ~1,000 small kernels from
Python, while the GPU's work for them (reading 1.4 GB of bf16 weights once) is ~0.5 ms. The
mixed forward (``mixed.py``) is no better: it launches attention per request. Capturing the step
once as a CUDA graph and replaying it launches all of it at once, which needs every tensor the
step touches at a fixed address: hence a static pool of KV slots instead of per-request caches.

How: ``SlotPool`` holds per layer K and V of shape [slots + 1, kv_heads, max_len, head_dim]; each
decoding row (a sample of a request) owns one slot; the extra last slot takes the writes of the
padding rows of a bucket. Once a request's prompt is prefilled (by the mixed forward, chunked, with
the prefix cache as before) and its first token sampled, ``SlotDecoder.adopt`` copies its rows' KV
into slots, and its cache becomes a ``SlotCache``. A decode step then runs ``static_forward`` over
all adopted rows: token ids, positions and slot ids are inputs; each layer writes the new K/V at
(slot, position), gathers the rows' first L positions and attends over them with a per-row length
mask. Rows are padded to a bucket (a power of two) and L is the smallest bucket covering the
longest row, so a handful of graphs (captured lazily, one per (rows, L) bucket) serve a run.

On CPU the same forward runs eagerly (``graphs=False``, ``EngineConfig.slot_decode: on``): that
is how the CPU tests check it against the mixed forward, token for token. With ``graphs=True`` off
CUDA, a "capture" runs the forward once on padding inputs and a "replay" reruns it reading the
static inputs, so the CPU tests also check the capture/replay protocol (a capture overwrites the
inputs: it must come before a step fills them, which a GPU run once got wrong).

Supported: the models ``mixed.py`` supports (Llama-style layers, full attention). A request whose
prompt plus ``max_tokens`` exceeds ``max_len``, or that finds no free slots, decodes on the
mixed path as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

import torch

MIN_LENGTH_BUCKET = 64


def _bucket(n: int, limit: int, least: int = 1) -> int:
    """The smallest power of two >= n (and >= least), capped at limit."""
    b = least
    while b < n:
        b *= 2
    return min(b, limit)


class SlotPool:
    """Static K/V for decoding rows: ``slots`` usable slots plus one padding slot, ``max_len`` positions each."""

    def __init__(self, config, slots: int, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        heads = config.num_key_value_heads or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (slots + 1, heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.slots, self.max_len, self.pad_slot = slots, max_len, slots
        self._free = list(range(slots - 1, -1, -1))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    @property
    def free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def release(self, slots: list[int]) -> None:
        self._free.extend(slots)


class SlotCache:
    """A request's KV once it decodes from the pool: one slot per active row, all rows ``length`` long. It offers
    what the engine and ``StandardDecoder`` use of a transformers cache (length, row selection, a row's K/V)."""

    def __init__(self, pool: SlotPool, slots: list[int], length: int) -> None:
        self.pool, self.slots, self.length = pool, slots, length

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        keep = [self.slots[i] for i in indices.tolist()]
        self.pool.release([s for s in self.slots if s not in keep])
        self.slots = keep

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, views [1, heads, length, head_dim] of row ``row`` (what ``kv_cache.kv_of`` gives)."""
        s, n = self.slots[row], self.length
        return [(k[s:s + 1, :, :n], v[s:s + 1, :, :n]) for k, v in zip(self.pool.keys, self.pool.values)]

    def release(self) -> None:
        self.pool.release(self.slots)
        self.slots = []


@dataclass
class _Graph:
    graph: object  # torch.cuda.CUDAGraph, or _Rerun off CUDA
    logits: torch.Tensor


class _Rerun:
    """Off CUDA (CPU tests of the capture protocol): ``replay`` reruns the forward into the captured output, reading
    the static inputs as a graph replay does."""

    def __init__(self, decoder: SlotDecoder, b: int, length: int) -> None:
        self.decoder, self.b, self.length = decoder, b, length
        self.out: torch.Tensor | None = None

    def replay(self) -> None:
        assert self.out is not None
        self.out.copy_(self.decoder.static_forward(self.b, self.length))


class SlotDecoder:
    """Decode steps of every adopted request as one static forward (a CUDA graph per bucket when ``graphs``)."""

    def __init__(self, model, slots: int, max_len: int, graphs: bool) -> None:
        param = next(model.parameters())
        self.model, self.device, self.graphs = model, param.device, graphs
        self.pool = SlotPool(model.config, slots, max_len, param.device, param.dtype)
        self._rotary = import_module(type(model).__module__).apply_rotary_pos_emb
        # static inputs: bucket b reads the first b entries (fixed addresses for the graphs)
        self.ids = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.rows = torch.full((slots,), self.pool.pad_slot, dtype=torch.long, device=self.device)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self.steps = self.captures = 0

    def fits(self, req) -> bool:
        return len(req.prompt) + req.params.max_tokens <= self.pool.max_len

    @torch.no_grad()
    def adopt(self, req) -> bool:
        """Move a request's rows (its cache's batch, in ``req.active`` order) into pool slots; False when they do
        not fit (the request then decodes on the mixed path)."""
        if not self.fits(req):
            return False
        slots = self.pool.alloc(len(req.active))
        if slots is None:
            return False
        cache, index = req.cache, torch.tensor(slots, device=self.device)
        length = cache.get_seq_length()
        for layer, k, v in zip(cache.layers, self.pool.keys, self.pool.values):
            k[index, :, :length] = layer.keys[:, :, :length]
            v[index, :, :length] = layer.values[:, :, :length]
        req.cache = SlotCache(self.pool, slots, length)
        return True

    @torch.no_grad()
    def decode(self, reqs: list) -> list[torch.Tensor]:
        """One decode step of every row of ``reqs`` (all with a ``SlotCache``): per request, logits [rows, vocab]
        of its rows' next token. Each cache grows by one position."""
        ids, pos, rows = [], [], []
        for req in reqs:
            c = req.cache
            ids += [req.samples[i].token_ids[-1] for i in req.active]
            pos += [c.length] * len(c.slots)
            rows += c.slots
        n = len(ids)
        b = _bucket(n, self.pool.slots)
        pad = b - n
        length = _bucket(max(pos) + 1, self.pool.max_len, MIN_LENGTH_BUCKET)
        # a new bucket is captured first: capturing runs the forward on padding inputs, so it must not see these
        g = (self._graphs.get((b, length)) or self._capture(b, length)) if self.graphs else None
        self.ids[:b].copy_(torch.tensor(ids + [0] * pad), non_blocking=True)
        self.pos[:b].copy_(torch.tensor(pos + [0] * pad), non_blocking=True)
        self.rows[:b].copy_(torch.tensor(rows + [self.pool.pad_slot] * pad), non_blocking=True)
        if g is not None:
            g.graph.replay()
            logits = g.logits[:n].clone()
        else:
            logits = self.static_forward(b, length)[:n]
        self.steps += 1
        out, at = [], 0
        for req in reqs:
            k = len(req.cache.slots)
            out.append(logits[at:at + k])
            at += k
            req.cache.length += 1
        return out

    def _capture(self, b: int, length: int) -> _Graph:
        """Capture bucket (b, length). It overwrites the static inputs with padding (their K/V writes go to the
        padding slot): call it before filling them for a step."""
        self.ids[:b].zero_()
        self.pos[:b].zero_()
        self.rows[:b].fill_(self.pool.pad_slot)
        if self.device.type != "cuda":
            rerun = _Rerun(self, b, length)
            rerun.out = self.static_forward(b, length)
            self._graphs[(b, length)] = g = _Graph(rerun, rerun.out)
            self.captures += 1
            return g
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the capture (library handles, autotuning)
                self.static_forward(b, length)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.static_forward(b, length)
        self._graphs[(b, length)] = g = _Graph(graph, logits)
        self.captures += 1
        return g

    def static_forward(self, b: int, length: int) -> torch.Tensor:
        """The decode forward of the first ``b`` static inputs over the first ``length`` positions of their slots:
        shapes depend on (b, length) only, and nothing syncs with the host, so it can be captured."""
        inner = self.model.model
        ids, pos, rows = self.ids[:b], self.pos[:b], self.rows[:b]
        h = inner.embed_tokens(ids)  # [b, hidden]
        cos, sin = inner.rotary_emb(h.unsqueeze(0), position_ids=pos.unsqueeze(0))
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [b, 1, head_dim]
        visible = torch.arange(length, device=self.device).unsqueeze(0) <= pos.unsqueeze(1)  # [b, length]
        bias = torch.zeros(visible.shape, device=self.device, dtype=torch.float32).masked_fill(~visible, float("-inf"))
        bias = bias[:, None, None, :]
        for layer, keys, values in zip(inner.layers, self.pool.keys, self.pool.values):
            attn = layer.self_attn
            hd = attn.head_dim
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(b, -1, 1, hd)
            k = attn.k_proj(x).view(b, -1, 1, hd)
            v = attn.v_proj(x).view(b, -1, 1, hd)
            q, k = self._rotary(q, k, cos, sin)
            keys[rows, :, pos] = k[:, :, 0]
            values[rows, :, pos] = v[:, :, 0]
            kv_heads = keys.shape[1]
            ks = keys[:, :, :length].index_select(0, rows)  # [b, kv_heads, length, hd]
            vs = values[:, :, :length].index_select(0, rows)
            qg = q.view(b, kv_heads, -1, hd)  # query heads grouped by the K/V head they share (GQA)
            scores = torch.matmul(qg, ks.transpose(-1, -2)).float() * attn.scaling + bias
            o = torch.matmul(scores.softmax(dim=-1).to(vs.dtype), vs)  # [b, kv_heads, group, hd]
            h = h + attn.o_proj(o.reshape(b, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(inner.norm(h))
