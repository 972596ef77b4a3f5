"""Text in and out of the server: prompts and chats to token ids, token ids to streamed text.

The engine's text comes from its tokenizer (the checkpoint's, or serve.tokenizer), decoded
incrementally. The simulator's token ids are hashes over the model's vocabulary that no tokenizer
would decode to readable text, so each becomes one word: a learned token of the project's tokenizer
made of a space and lower-case letters (one token there, and about one in any BPE tokenizer), so a
client that counts tokens in the text counts about as many as were generated.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Protocol

from engine.tokenizer_builder import CHAT_TEMPLATE, IM_END, build_tokenizer

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers < 0.21
    DecodeStream = None


class Decoder(Protocol):
    def add(self, token_ids: list[int]) -> str:
        """The text the new tokens complete (a partial character waits for its next bytes)."""


class TextCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat, with the assistant's turn opened."""

    def decoder(self) -> Decoder: ...

    def decode(self, token_ids: list[int]) -> str: ...


class HFCodec:
    """A transformers tokenizer; its chat template, or ChatML when it has none."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = CHAT_TEMPLATE

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def chat(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def decoder(self) -> Decoder:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None and DecodeStream is not None:
            return _StreamDecoder(backend)
        return _IncrementalDecoder(self)


class _StreamDecoder:
    """The tokenizers library's own incremental decoder (a token at a time, in Rust): the same text
    as _IncrementalDecoder's (tests/harness/serve/test_text.py), a tenth of its time per token."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.stream = DecodeStream(skip_special_tokens=True)

    def add(self, token_ids: list[int]) -> str:
        step, backend = self.stream.step, self.backend
        return "".join([text for t in token_ids if (text := step(backend, t))])


class _IncrementalDecoder:
    """Decodes a short window of recent tokens each time: the text of tokens [prefix, read) is
    known; the new text is what decoding [prefix, end) adds to it, held back while it ends in a
    partial UTF-8 character (U+FFFD)."""

    def __init__(self, codec: HFCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def add(self, token_ids: list[int]) -> str:
        self.ids.extend(token_ids)
        decode = self.codec.decode
        known = decode(self.ids[self.prefix:self.read])
        text = decode(self.ids[self.prefix:])
        if len(text) <= len(known) or text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(known):]


class WordCodec(HFCodec):
    """The project's tokenizer for prompts; one word per generated token (module docstring)."""

    def __init__(self, tokenizer: Any = None) -> None:
        super().__init__(tokenizer if tokenizer is not None else _project_tokenizer())

    def decode(self, token_ids: list[int]) -> str:
        words = _words()
        return "".join(words[t % len(words)] for t in token_ids)

    def decoder(self) -> Decoder:
        return _WordDecoder(self)


class _WordDecoder:
    def __init__(self, codec: WordCodec) -> None:
        self.decode = codec.decode

    def add(self, token_ids: list[int]) -> str:
        return self.decode(token_ids)


@cache
def _words() -> tuple[str, ...]:
    vocab = build_tokenizer().get_vocab()
    # "Ġ" is the byte-level BPE's space
    return tuple(" " + k[1:] for k in sorted(vocab) if k.startswith("Ġ") and k[1:].isalpha() and k[1:].islower())


def load_codec(backend: str, tokenizer_dir: str | None) -> TextCodec:
    """tokenizer_dir's tokenizer (the engine's checkpoint's), or the project's when it is None (the
    tokenizer a random-weight model of load_format=dummy carries). The simulator's codec reads
    prompts with it and writes one word per token (WordCodec)."""
    tokenizer = None
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if backend == "sim":
        return WordCodec(tokenizer)
    return HFCodec(tokenizer if tokenizer is not None else _project_tokenizer())


def _project_tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(), eos_token=IM_END)
