"""Marks shared by the GPU kernel tests: selected by -m gpu, skipped without CUDA or Triton."""

import importlib.util

import pytest
import torch

needs_cuda = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton"),
]
