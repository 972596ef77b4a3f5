"""A small byte-level BPE tokenizer for checkpoints written without a hub.

Byte-level means every string round-trips: the 256 byte symbols are always in the vocabulary, so
any text encodes, and merges only make common strings shorter. The merges are learned from a
short built-in text; training is deterministic, so the same call gives the same tokenizer.json.
Special tokens follow Qwen's chat format and come after the learned vocabulary, as in Qwen.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.core.model_shapes import TOKENIZER_VOCAB_SIZE

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# Total tokenizer size (learned + special + reserved). Tiny checkpoints use exactly this as their
# vocab_size so that every id a model can emit decodes to something (engine.core.model_shapes).
TOKENIZER_SIZE = TOKENIZER_VOCAB_SIZE

# ChatML, the format of Qwen's chat models, written from scratch.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TRAINING_TEXT = """\
A serving engine keeps many requests in flight at once. Each request brings a prompt, and the
engine must first read the whole prompt before it can write the first new token. Reading the
prompt is called prefill; writing one token at a time afterwards is called decode. The keys and
values of every token seen so far are kept in a cache, split into fixed-size blocks, so that
memory is handed out in small pieces and shared between requests that start with the same text.
When memory runs out, the scheduler pauses a request, frees its blocks, and later computes them
again. The simulator prices each step with a cost model instead of running the model, which lets
a user ask how many machines a workload needs before buying any of them.
Questions and answers: What is the capital of France? Paris. How many days are in a week? Seven.
Write a short poem about the sea. The sea is wide, the sea is deep, it sings the sailors into sleep.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 256 1024 4096 2025 3.14159 -42 1e-6
def schedule(requests, budget):
    batch = []
    for request in requests:
        if request.num_tokens <= budget:
            batch.append(request)
            budget -= request.num_tokens
    return batch
"""


def build_tokenizer() -> Tokenizer:
    """The tokenizer itself: TOKENIZER_SIZE ids, specials right after the learned ones."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    num_learned = TOKENIZER_SIZE - len(SPECIAL_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=num_learned,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TRAINING_TEXT.splitlines(keepends=True), trainer)
    specials = list(SPECIAL_TOKENS)
    # NOTE: a short text may run out of pairs to merge before num_learned; reserved specials fill
    # the gap so the size (and hence the ids of everything after) never depends on the corpus.
    shortfall = num_learned - tokenizer.get_vocab_size()
    specials += [f"<|reserved_{i}|>" for i in range(shortfall)]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if tokenizer.get_vocab_size() != TOKENIZER_SIZE:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} ids, expected {TOKENIZER_SIZE}")
    return tokenizer


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    return {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}


def save_tokenizer(tokenizer: Tokenizer, out_dir: str | Path, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json, loadable offline by transformers.AutoTokenizer."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    added = {
        str(tokenizer.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        # Like Qwen3: no bos is prepended (there is no post-processor), eos ends a chat turn.
        "bos_token": ENDOFTEXT,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
