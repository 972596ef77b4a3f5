"""The engine server's incremental detokeniser: tokenizers' DecodeStream, which must give the same
text as decoding a window of recent tokens (the fallback for tokenizers < 0.21), piece by piece,
when tokens come one at a time; and the same text however the tokens are batched (the window holds
a whole batch back while it ends in a partial character, so its text depends on the batching)."""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from engine.tokenizer_builder import IM_END, build_tokenizer
from harness.serve.text import HFCodec, _IncrementalDecoder, _StreamDecoder


@cache
def codec() -> HFCodec:
    return HFCodec(PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(), eos_token=IM_END))


def test_the_engine_codec_streams_with_decode_stream():
    assert isinstance(codec().decoder(), _StreamDecoder)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 700), min_size=1, max_size=4), min_size=1, max_size=40),
       st.text(max_size=30))
def test_stream_decoder_equals_the_window_decoder(batches, text):
    """Random ids (some past the 512-id vocabulary, as a random-weight model samples, many of them
    partial UTF-8 characters) and a real text's ids, delivered in batches of 1 to 4."""
    c = codec()
    batches = [*batches, c.encode(text)] if text else batches
    ids = [t for b in batches for t in b]
    fast, window = _StreamDecoder(c.tokenizer.backend_tokenizer), _IncrementalDecoder(c)
    one_by_one = [fast.add([t]) for t in ids]
    assert one_by_one == [window.add([t]) for t in ids]
    batched = _StreamDecoder(c.tokenizer.backend_tokenizer)
    assert "".join(batched.add(b) for b in batches) == "".join(one_by_one)
