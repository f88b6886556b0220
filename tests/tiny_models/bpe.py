"""The byte-level BPE text tokenizer the tiny models share, trained here with ``tokenizers``
on a few lines (nothing downloaded), saved the way Hugging Face loaders read it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_bpe_tokenizer(out: Path, corpus: list[str], specials: list[str], vocab_size: int,
                        **config: Any) -> Any:
    """Train a byte-level BPE on ``corpus`` (special tokens first), write ``tokenizer.json``
    and a ``tokenizer_config.json`` (ChatML end of turn as EOS; ``config`` adds to or
    overrides its fields) into ``out``, and return the trained ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus * 4, trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        **config,
    }, indent=2))
    return tokenizer
