"""Building blocks of the decoder: tensor-parallel linears and embeddings, norms, RoPE,
activation, and the paged attention layer that hands off to an attention backend."""
