"""A tiny randomly initialised Llama-style model with temper's character tokenizer
(``temper.core.tokenizer``: nothing is downloaded, the same vocabulary on every machine).
"""

from __future__ import annotations

from pathlib import Path

from temper.core.tokenizer import build_tokenizer


def init_tiny(out: str | Path, hidden: int = 64, layers: int = 2, heads: int = 4, max_positions: int = 512,
              seed: int = 0, kv_heads: int | None = None, intermediate: int | None = None, device: str = "cpu",
              dtype: str = "float32") -> Path:
    """Write a random Llama + tokenizer as a normal HF folder (reloads with from_pretrained): tiny by default; the
    GPU benchmark makes a ~0.7B one (``kv_heads`` for grouped-query attention, built on ``device``, saved in
    ``dtype``)."""
    # lazy: torch+transformers (2.3 s) would load whenever flows.post_training is imported
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate or hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                         max_position_embeddings=max_positions, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
