"""A single-turn prompt as the model reads it: one user message in the model's own chat template.

An instruct model was tuned on its chat format; fed a bare question it continues the text instead
of answering (SmolLM2-135M-Instruct). So every place that turns a domain's rendered prompt into
tokens (SFT rows, GRPO rows, the eval job) goes through ``chat_prompt``, and the same model sees
the same text in training and in eval. A tokenizer without a chat template gets the text as it is.
A multi-step domain's first turn is formatted the same way; its later observations follow as plain
blocks (``temper.training.multiturn.observation_block``), the same in training and in eval.
"""

from __future__ import annotations

from typing import Any

#: Model metadata recorded with a registered version: how its prompts were formatted in training.
PROMPT_FORMAT = "chat template, one user message, generation prompt added (temper.core.chat.chat_prompt)"


def chat_prompt(tokenizer: Any, text: str) -> str:
    """``text`` as one user turn of ``tokenizer``'s chat template, ending where the assistant's answer starts."""
    if not getattr(tokenizer, "chat_template", None):
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=False)
