"""A character-level Hugging Face tokenizer built in memory (no hub download) for tests."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
PAD, EOS = "<pad>", "<eos>"


def make_char_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (plus newline); id 0 is padding, id 1 is EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {PAD: 0, EOS: 1}
    for ch in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, eos_token=EOS)
    tokenizer.chat_template = chat_template
    return tokenizer
