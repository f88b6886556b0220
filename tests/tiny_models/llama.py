"""A tiny random-weight llama that real loaders (mlx_lm.load, mlx_lm.server) accept.

Built locally in a second or two: 2 layers, hidden size 64, a byte-level BPE tokenizer
trained with ``tokenizers`` on a few lines of text, and a ChatML ``chat_template``. It talks
nonsense (random weights, possibly invalid UTF-8) but exercises the whole serving path.
Shared by tests and benchmarks: ``build_tiny_llama(dir)``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_models.bpe import write_bpe_tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Your meeting with Dr. Patel starts at 3:30 p.m. in room 4.",
    "Hosting came to $184.50 last month, about 12% more than before.",
    "Version 2.4.1 fixes the login loop; see example.org for details.",
    "It's 23.7 km to the airport, roughly 35 minutes by car.",
    "Hello! How can I help you today? Sure, here is a short answer.",
]


def build_tiny_llama(directory: str | Path, *, vocab_size: int = 512, seed: int = 0) -> Path:
    """Write a loadable tiny llama into ``directory`` (created if needed) and return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = write_bpe_tokenizer(
        out, _CORPUS, SPECIAL_TOKENS, vocab_size, model_max_length=512,
        clean_up_tokenization_spaces=False, chat_template=CHATML_TEMPLATE)

    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "vocab_size": tokenizer.get_vocab_size(),
        "tie_word_embeddings": True,
        "eos_token_id": tokenizer.token_to_id("<|im_end|>"),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))

    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return out
