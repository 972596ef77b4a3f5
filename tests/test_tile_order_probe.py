"""experiments/kernels/tile_order: what it refuses on a machine without the GPU it needs, and the
baseline kernel loaded beside the current one."""

from __future__ import annotations

import pytest
import torch

from experiments.kernels import tile_order


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_a_gpu_the_probe_stops_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="^error: no CUDA device$"):
        tile_order.main(["--out", str(tmp_path)])


def test_a_baseline_that_is_not_a_python_module_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="not a Python file"):
        tile_order.load_baseline(tmp_path / "kernel.txt")

