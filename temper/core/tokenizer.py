"""temper's character tokenizer: the tiny model's (``temper.training.tiny``) and the one the
long-context generator counts lengths with by default (``temper.data.generators_long_context``).

Nothing is downloaded: a fixed vocabulary (printable ASCII plus newline and tab) built with the
``tokenizers`` library, so any starter-domain text encodes without unknown tokens and the same
vocabulary comes out on every machine. Characters make arithmetic learnable by a tiny model (one
token per digit). Here, in the leaf, because both the data room and the training room above it
need it.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
CHARS = [c for c in string.printable if c not in "\r\x0b\x0c"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer():
    # lazy: transformers (800 ms) would load whenever flows.post_training is imported
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast
