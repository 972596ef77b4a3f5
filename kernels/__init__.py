"""Triton kernels for the engine's attention path, and pure-torch references for their tests.

Modules (import them directly; this package imports nothing so that `kernels.reference` works on
machines without Triton):

- `kernels.store_kvcache`: scatter new K/V rows into the paged cache.
- `kernels.decode_attention`: split-KV (flash-decoding) paged attention, one query per sequence.
- `kernels.prefill_attention`: causal varlen attention whose keys come from the paged cache.
- `kernels.reference`: float32 torch versions of the three, used as ground truth.
"""
