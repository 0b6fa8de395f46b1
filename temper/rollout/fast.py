"""The fast serving profile: speculative decoding with transformers assisted generation, and its drafts.

Each scheduler turn of a fast request calls ``target.generate(..., assistant_model=draft)`` for up to
``tokens_per_turn`` tokens, then yields to the other requests. With ``verify=True`` (the only
setting to serve) the target checks every draft token, so greedy output is the target's own; the
parity gate (``parity.py``) proves that on an eval prompt set before the profile is registered.

Known cost, measured, not assumed: transformers 5.24's assisted decoding cannot continue from a
pre-filled KV cache (its first iteration re-feeds the whole input, so a passed cache ends up with
the prompt twice). A fast turn therefore re-encodes prompt + completion-so-far on both models, the
prefix cache is not used by this profile, and a long prompt is prefilled in one piece, not chunked.
That is why ``tokens_per_turn`` is large: fewer turns, fewer re-encodes.

Drafts: ``derive_layer_draft`` keeps the first k decoder layers of the target (same embeddings,
tokenizer, head); ``quantized_draft`` is an int8 dynamic-quantized copy of a model. On a tiny random
model a layer-truncated draft agrees with the target on few tokens (random layers are not
redundant), so it slows decoding down; the int8 copy agrees on almost every token, which is what a
draft has to do to pay for itself. The benchmark reports both.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch

from temper.rollout.config import SpeculativeConfig
from temper.rollout.requests import DecoderHost, EngineRequest


class SpeculativeDecoder:
    needs_prefill = False  # assisted generate encodes the prompt itself (see module docstring)
    mixes = False  # generate() runs its own forwards
    supports_logprobs = False  # generate() would need output_scores; the fast profile serves eval, not GRPO

    def __init__(self, engine: DecoderHost, spec: SpeculativeConfig, draft=None) -> None:
        # lazy: transformers (800 ms) would load whenever temper.rollout.client is imported
        from transformers import GenerationConfig

        self.engine, self.spec = engine, spec
        self.draft = draft if draft is not None else load_draft(spec, engine.model)
        self.draft.eval()
        self.draft.generation_config.num_assistant_tokens = spec.num_assistant_tokens
        self._base = GenerationConfig(pad_token_id=_pad_id(engine), num_assistant_tokens=spec.num_assistant_tokens)

    def begin(self, req: EngineRequest, logits) -> None:
        req.active = list(range(req.params.n))

    @torch.no_grad()
    def step(self, req: EngineRequest) -> None:
        """One turn for every active sample: up to ``tokens_per_turn`` tokens each."""
        e, p = self.engine, req.params
        for index in list(req.active):
            sample = req.samples[index]
            seq = req.prompt + sample.token_ids
            budget = min(self.spec.tokens_per_turn, p.max_tokens - len(sample.token_ids), e.context - len(seq))
            gc = copy.copy(self._base)
            gc.max_new_tokens = max(1, budget)
            gc.do_sample = not p.greedy
            if not p.greedy:
                gc.temperature, gc.top_p = p.temperature, p.top_p
            gc.eos_token_id = [] if p.ignore_eos else sorted(e.eos_ids)  # None would fall back to the model's eos
            ids = torch.tensor([seq], device=e.device)
            if p.seed is not None and not p.greedy:
                torch.manual_seed(p.seed + len(sample.token_ids))  # generate() samples from the global RNG
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if self.spec.verify:
                    out = e.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc,
                                           assistant_model=self.draft)
                else:  # lossy: the draft's own tokens, no target check (exists to exercise the parity gate)
                    out = self.draft.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
            new = out[0, len(seq):].tolist()
            e._log(req, "decode", len(new), "speculative")
            e.accept(req, index, new)
            if sample.finished or not new:
                if not sample.finished:
                    sample.finish_reason = "length"
                req.active.remove(index)


def _pad_id(engine: DecoderHost) -> int:
    pad = engine.tokenizer.pad_token_id
    return pad if pad is not None else sorted(engine.eos_ids)[0]


def load_draft(spec: SpeculativeConfig, target):
    """The draft the config names: its folder (in the target's dtype), int8-quantized if asked; or an int8 copy
    of the target when no folder is given."""
    # lazy: transformers (800 ms) would load whenever temper.rollout.client is imported
    from transformers import AutoModelForCausalLM

    if spec.quantize_draft and target.device.type != "cpu":
        raise ValueError("quantize_draft makes an int8 CPU copy (torch's dynamic quantization); on a GPU give the "
                         "fast profile a draft_dir (a smaller model with the target's tokenizer)")
    draft = AutoModelForCausalLM.from_pretrained(spec.draft_dir, dtype=target.dtype).to(target.device) \
        if spec.draft_dir else target
    if spec.quantize_draft:
        draft = quantized_draft(draft)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft {spec.draft_dir} vocab {draft.config.vocab_size} != target "
                         f"{target.config.vocab_size}: assisted generation needs the same tokenizer")
    return draft


def derive_layer_draft(target_dir: str | Path, out_dir: str | Path, keep_layers: int) -> Path:
    """Write a draft that is the target with only its first ``keep_layers`` decoder layers (tokenizer copied)."""
    # lazy: transformers (800 ms) would load whenever temper.rollout.client is imported
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target_dir)
    total = model.config.num_hidden_layers
    if not 0 < keep_layers < total:
        raise ValueError(f"keep_layers must be in 1..{total - 1}, got {keep_layers}")
    model.model.layers = model.model.layers[:keep_layers]
    model.config.num_hidden_layers = keep_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:keep_layers]
    out = Path(out_dir)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(out)
    return out


def quantized_draft(model):
    """An int8 dynamic-quantized copy of ``model`` (Linear layers), for use as an in-memory draft.

    Uses ``torch.ao.quantization.quantize_dynamic``, deprecated in favour of torchao but present in
    torch 2.13; CPU only.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).eval(), {torch.nn.Linear}, dtype=torch.qint8)
    return q
