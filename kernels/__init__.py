"""Triton kernels for the engine's GPU path, and pure-torch float32 references for their tests.

Modules (import them directly; this package imports nothing so that the references work on
machines without Triton):

Attention over the paged KV cache (`engine/attention/triton_backend.py`):
- `kernels.store_kvcache`: scatter new K/V rows into the paged cache.
- `kernels.decode_attention`: split-KV (flash-decoding) paged attention, one query per sequence.
- `kernels.prefill_attention`: causal varlen attention whose keys come from the paged cache.
- `kernels.prefill_tiles`: its tile shapes and fixed-size tile maps (host side, no Triton).
- `kernels.reference`: float32 torch versions of the three, used as ground truth.

Fused elementwise kernels and sampling (`EngineConfig.fused_kernels="triton"`, CUDA only):
- `kernels.rmsnorm`: RMSNorm over rows or per head, optionally fused with the residual add (and
  with the sum of a mixture-of-experts layer's top-k outputs).
- `kernels.activation`: SiLU(gate) * up of the fused gate/up projection.
- `kernels.rotary`: Qwen3's per-head q/k RMSNorm and the rotary embedding, in place.
- `kernels.sampling`: Gumbel-max sampling of a logits batch in one pass (temperature, cutoff,
  counter-hash noise shared with `engine/sampler_noise.py`).
- `kernels.fused_moe`: mixture of experts, tokens grouped by expert, two grouped GEMMs (gate/up with
  SiLU-and-mul fused, down with the router weight), the top-k sum; `kernels.moe_route` the router's
  softmax, top-k and renormalisation in one launch with the alignment's counts,
  `kernels.moe_align_triton` the alignment into one-expert tiles, `kernels.moe_configs` the tuned
  tiles; `kernels.moe_reference` holds the router, the CPU grouped path and the float32 per-token
  reference.
- `kernels.elementwise_reference`: float32 torch versions of rmsnorm, activation and rotary.

`kernels.validation` holds the host-side argument checks the wrappers share.
"""
