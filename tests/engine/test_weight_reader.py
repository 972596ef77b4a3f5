"""engine.weight_reader: the loaded parameters are the checkpoint's tensors (rebuilt here from the
file on the CPU, not through the weight loaders), on the CPU (memory map) and on a GPU (streamed
through pinned buffers, the default there, and mapped), with dtype conversion; which reader each
mode and device takes; odd offsets; broken headers."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file

from engine import weight_reader
from engine.loader import CheckpointError, load_model, load_weights
from engine.weight_reader import Entry, batches, read_tensors

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _expected(model, tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """Parameter `name` (tensor parallel size 1) put together from the checkpoint's tensors: fused
    ones are their pieces stacked on the rows (q, k, v; gate, up), experts stacked on a new dim."""
    hf = model.checkpoint_names(name)
    if ".mlp.experts." in name:
        per = 2 if name.endswith("gate_up_proj") else 1
        return torch.stack([torch.cat([tensors[h] for h in hf[i:i + per]]) for i in range(0, len(hf), per)])
    return torch.cat([tensors[h] for h in hf])


def _check_equal(model, folder) -> int:
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    checked = 0
    for name, param in model.named_parameters():
        want = _expected(model, tensors, name).to(param.dtype)
        assert torch.equal(param.detach().cpu(), want), name
        checked += 1
    assert checked == len(list(model.parameters()))
    return checked


@pytest.mark.parametrize("preset", ["tiny_qwen3_dir", "tiny_qwen2_dir", "tiny_qwen3_moe_dir"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loaded_weights_are_the_checkpoint_on_cpu(request, preset, dtype):
    folder = request.getfixturevalue(preset)
    model, _ = load_model(folder, dtype=dtype)
    assert _check_equal(model, folder) > 10


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["streamed", "mapped"])
def test_loaded_weights_are_the_checkpoint_on_gpu(monkeypatch, tiny_qwen3_moe_dir, tiny_qwen2_dir, mode):
    # small batches and pieces: spans of several pieces, pinned buffers reused, read-ahead across batches
    monkeypatch.setattr(weight_reader, "BATCH_BYTES", 50_000)
    monkeypatch.setattr(weight_reader, "CHUNK_BYTES", 8192)
    monkeypatch.setattr(weight_reader, "READERS", 2)
    for folder in (tiny_qwen3_moe_dir, tiny_qwen2_dir):
        for dtype in ("float32", "bfloat16"):
            model, _ = load_model(folder, dtype=dtype, device="cuda", load_format="dummy")  # random, then read
            load_weights(model, folder, mode)
            _check_equal(model, folder)
    streamed = []
    real = weight_reader._streamed
    monkeypatch.setattr(weight_reader, "_streamed", lambda *a: streamed.append(a[0]) or real(*a))
    model, _ = load_model(tiny_qwen2_dir, device="cuda")  # the default read onto a GPU: streamed
    assert streamed and model.weights_load_s is not None and model.weights_load_s > 0
    _check_equal(model, tiny_qwen2_dir)


def _write(path, tensors: list[tuple[str, str, list[int], bytes]]) -> None:
    """A safetensors file written by hand, tensors packed back to back in the order given."""
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(t[3] for t in tensors))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[cuda, pytest.mark.gpu])])
def test_odd_offsets_and_scalars(tmp_path, device):
    floats = torch.tensor([1.5, -2.25, 3.0])
    path = tmp_path / "odd.safetensors"
    _write(path, [("a", "U8", [3], bytes([7, 8, 9])), ("b", "F32", [3], floats.numpy().tobytes()),
                  ("c", "BF16", [], torch.tensor(0.5, dtype=torch.bfloat16).view(torch.int16).numpy().tobytes())])
    got = {name: t.cpu().clone() for name, t in read_tensors(path, torch.device(device))}
    assert got["a"].tolist() == [7, 8, 9]
    assert torch.equal(got["b"], floats)
    assert got["c"].shape == () and got["c"].item() == 0.5


@pytest.mark.parametrize("content, message", [
    (b"\x01", "truncated or corrupt"),
    (struct.pack("<Q", 10**6) + b"{}", "a header of 1000000 bytes"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (struct.pack("<Q", 2) + b"{x", "truncated or corrupt"),
])
def test_broken_headers_name_the_file(tmp_path, content, message):
    path = tmp_path / "broken.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message) as error:
        list(read_tensors(path, torch.device("cpu")))
    assert str(path) in str(error.value)


def test_a_tensor_past_the_end_or_of_the_wrong_size_is_named(tmp_path):
    path = tmp_path / "short.safetensors"
    _write(path, [("w", "F32", [4], bytes(16))])
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="tensor 'w' cannot be read"):
        list(read_tensors(path, torch.device("cpu")))
    _write(path, [("w", "F32", [5], bytes(16))])
    with pytest.raises(CheckpointError, match="tensor 'w'.*20 expected"):
        list(read_tensors(path, torch.device("cpu")))


def test_bad_mode_is_refused(tmp_path):
    path = tmp_path / "w.safetensors"
    _write(path, [("w", "F32", [1], bytes(4))])
    with pytest.raises(ValueError, match="mode must be one of"):
        list(read_tensors(path, torch.device("cpu"), "fast"))
    with pytest.raises(ValueError, match="onto a GPU"):
        list(read_tensors(path, torch.device("cpu"), "streamed"))


@pytest.mark.parametrize("device, mode, path", [("cuda", "auto", "streamed"), ("cpu", "auto", "mapped"),
                                               ("cuda", "mapped", "mapped"), ("cuda", "streamed", "streamed")])
def test_auto_streams_onto_a_gpu_and_maps_onto_the_cpu(monkeypatch, tmp_path, device, mode, path):
    """Which reader each mode takes (the readers replaced by recorders: no GPU needed)."""
    file = tmp_path / "w.safetensors"
    _write(file, [("w", "F32", [1], bytes(4))])
    taken = []
    for name in ("_streamed", "_mapped"):
        monkeypatch.setattr(weight_reader, name, lambda p, e, d, name=name: iter(taken.append(name) or ()))
    list(read_tensors(file, torch.device(device), mode))
    assert taken == [f"_{path}"]


def test_the_engines_weight_read_reaches_the_reader_and_defaults_to_auto(monkeypatch, tiny_qwen3_dir):
    """EngineConfig.weight_read goes to every file's read (LLM -> executor -> rank -> loader); unset, "auto"
    (streamed onto a GPU, by the test above); a bad value or streamed onto the CPU is one line."""
    from engine import loader
    from engine.config import EngineConfig
    from engine.llm import LLM

    modes = []
    real = loader.read_tensors
    monkeypatch.setattr(loader, "read_tensors", lambda path, device, mode: modes.append(mode) or real(path, device,
                                                                                                      mode))
    LLM(tiny_qwen3_dir, device="cpu", dtype="float32", max_model_len=64, weight_read="mapped")
    LLM(tiny_qwen3_dir, device="cpu", dtype="float32", max_model_len=64)
    assert modes == ["mapped", "auto"]
    with pytest.raises(ValueError, match=r"^EngineConfig.weight_read must be one of \('auto', 'mapped', 'streamed'\)"):
        EngineConfig(model="m", weight_read="fast")
    with pytest.raises(ValueError, match="weight_read='streamed' reads through pinned memory onto a GPU"):
        EngineConfig(model="m", device="cpu", weight_read="streamed")


@given(st.lists(st.integers(0, 300), max_size=30), st.integers(1, 500))
def test_batches_cover_every_tensor_once_in_order_within_the_limit(sizes, limit):
    entries, at = [], 0
    for i, size in enumerate(sizes):
        entries.append(Entry(f"t{i}", torch.uint8, (size,), at, at + size))
        at += size
    groups = batches(entries, limit)
    assert [e for g in groups for e in g] == entries
    for g in groups:
        assert len(g) == 1 or g[-1].end - g[0].begin <= limit


class _NoEvent:
    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


def test_the_streamed_path_reads_every_byte_on_cpu_with_cuda_faked(monkeypatch, tmp_path):
    """The streamed reader's pieces, pinned slots and read-ahead, run on the CPU (CUDA's event,
    stream and pinning faked): tiny pieces and batches, an empty tensor between batches, odd offsets."""
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    monkeypatch.setattr(torch.cuda, "Event", _NoEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(weight_reader, "BATCH_BYTES", 40)
    monkeypatch.setattr(weight_reader, "CHUNK_BYTES", 7)
    monkeypatch.setattr(weight_reader, "READERS", 2)
    generator = torch.Generator().manual_seed(0)
    # batches (40 bytes at most): [a], [c], [e] (empty, at an aligned offset), [d], [b, f] (f at an odd offset)
    tensors = [("a", "F32", [2]), ("c", "F32", [4, 3]), ("e", "F32", [0]), ("d", "BF16", [30]), ("b", "U8", [3]),
               ("f", "F32", [3])]
    values = {name: torch.randn(*shape, generator=generator).to(weight_reader._DTYPES[dtype])
              for name, dtype, shape in tensors if dtype != "U8"}
    values["b"] = torch.tensor([1, 2, 250], dtype=torch.uint8)
    path = tmp_path / "w.safetensors"
    _write(path, [(name, dtype, shape, values[name].contiguous().view(torch.uint8).numpy().tobytes())
                  for name, dtype, shape in tensors])
    entries = weight_reader.read_header(path)
    assert [[e.name for e in g] for g in batches(entries)] == [["a"], ["c"], ["e"], ["d"], ["b", "f"]]
    got = {name: t.clone() for name, t in weight_reader._streamed(path, entries, torch.device("cpu"))}
    assert list(got) == [name for name, _, _ in tensors]
    for name, want in values.items():
        assert torch.equal(got[name], want), name
