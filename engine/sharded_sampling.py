"""Sampling under tensor parallelism without gathering the logits.

Each rank's LM head holds a slice of the vocabulary. Gathering every rank's logits to draw one
token a row moves [rows, vocab] values a step (21 MB for 140 rows of Qwen3's vocabulary at
TP=2, bf16), and then rank 0 alone samples and broadcasts the ids. Gumbel-max needs neither: a
row's token is the argmax over the vocabulary of logit / T + noise, and the noise of entry v is a
hash of (the row's key, v) (engine.sampler_noise), so each rank scores its own slice with the
global indices, keeps the best score of each piece of it, and the ranks exchange those
(rows x a few pieces x 8 bytes). Every rank then picks the same token a single GPU would: the
best score, the lowest index among equals, the pieces in vocabulary order. No broadcast follows:
every rank already holds the ids the next step's placeholders need (engine.overlap).

Rank 0 decides per step whether the rows allow it (engine.core.sampling_params.samples_by_shard:
no top-k or top-p, which need a row's whole vocabulary) and sends the draw (each row's inverse
temperature and noise key, a ShardDraw) with the batch; otherwise the step gathers the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from engine.host_staging import HostStaging
from engine.sampler_noise import log_exponential

_NO_INDEX = torch.iinfo(torch.int32).max  # above every vocabulary index: loses every tie


@dataclass
class ShardDraw:
    """One step's draw, built by rank 0's sampler and sent to every rank with the batch."""

    inv_temp: np.ndarray  # [rows] float32; 0 = greedy
    key_words: np.ndarray  # [rows, 2] int32: each row's noise key (engine.sampler_noise)

    def packed(self) -> np.ndarray:
        """Both arrays as one int32 array (one upload): inverse temperatures' bits, then the keys."""
        return np.concatenate([self.inv_temp.astype(np.float32).view(np.int32), self.key_words.reshape(-1)])


class ShardedSampler:
    """Draws a step's tokens from this rank's slice of the vocabulary (module docstring).

    lm_head: the model's ParallelLMHead; all_gather: the tensor-parallel group's concatenation
    over ranks along the last dim; kernel: score the slice with kernels.sampling (CUDA), else
    with torch ops (the reference, and CPU)."""

    def __init__(self, lm_head, all_gather: Callable[[torch.Tensor], torch.Tensor], device: torch.device,
                 kernel: bool) -> None:
        self.lm_head = lm_head
        self.all_gather = all_gather
        self.staging = HostStaging(device)
        self.kernel = kernel

    @torch.inference_mode()
    def sample(self, hidden: torch.Tensor, draw: ShardDraw) -> torch.Tensor:
        """hidden [rows, hidden] (the rows that sample) -> the sampled ids [rows] int64, the same
        on every rank."""
        rows = hidden.shape[0]
        packed = self.staging.upload([draw.packed()], torch.int32)[0]
        inv_temp, key_words = packed[:rows].view(torch.float32), packed[rows:].view(rows, 2)
        logits = self.lm_head.shard_logits(hidden)  # [rows, this rank's vocabulary entries]
        best, index = self._pieces(logits, inv_temp, key_words)  # [rows, pieces] each
        pieces = best.shape[1]
        # one exchange for both: per rank [scores' bits | indices], concatenated in rank order
        every = self.all_gather(torch.cat([best.view(torch.int32), index], dim=1))
        every = every.view(rows, -1, 2, pieces)
        best = every[:, :, 0].reshape(rows, -1).view(torch.float32)
        index = every[:, :, 1].reshape(rows, -1)
        if self.kernel:
            from kernels.sampling import best_of_pieces

            return best_of_pieces(best.contiguous(), index.contiguous())
        top = best.max(dim=1, keepdim=True).values
        return torch.where(best == top, index, _NO_INDEX).min(dim=1).values.long()

    def _pieces(self, logits: torch.Tensor, inv_temp: torch.Tensor, key_words: torch.Tensor):
        """Each piece's best score [rows, P] float32 and vocabulary index [rows, P] int32, P the
        same on every rank (the collective needs equal shapes): the last rank's slice may be
        shorter, its missing pieces are padding that loses to any score."""
        first, rows = self.lm_head.first, logits.shape[0]
        if self.kernel:
            from kernels.sampling import CHUNK, gumbel_argmax_pieces

            best, index = gumbel_argmax_pieces(logits, inv_temp, key_words, vocab_offset=first)
            missing = -(-self.lm_head.rows // CHUNK) - best.shape[1]
        elif logits.shape[1]:  # the reference: one piece per rank
            x = logits.float()
            noise = log_exponential(key_words, x.shape[1], first)
            scores = torch.where(inv_temp[:, None] == 0, x, x * inv_temp[:, None] - noise)
            column = scores.argmax(dim=1, keepdim=True)  # the first of equals
            best, index, missing = scores.gather(1, column), (column + first).to(torch.int32), 0
        else:
            best = torch.empty((rows, 0), dtype=torch.float32, device=logits.device)
            index, missing = torch.empty((rows, 0), dtype=torch.int32, device=logits.device), 1
        if missing:
            best = torch.cat([best, best.new_full((rows, missing), float("-inf"))], dim=1)
            index = torch.cat([index, index.new_full((rows, missing), _NO_INDEX)], dim=1)
        return best, index
