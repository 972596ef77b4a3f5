"""Every model the project knows by name: the one place its shape is written down.

A name here is the model's only spelling. It is the Hydra option (`model=qwen3-0.6b`, file
conf/model/qwen3-0.6b.yaml), the checkpoint preset (`python -m engine.checkpoint --preset
qwen3-0.6b`) and the folder of its random-weight checkpoint (`checkpoints/qwen3-0.6b/`).
Both backends derive from these records: sim.specs.ModelSpec (what the simulator prices) and
engine.models.presets (the config.json the checkpoint writer ships). Plain data, so the simulator
reads it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL_TYPES = ("qwen3", "qwen2", "llama")
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1}
# The project's own tokenizer (engine.tokenizer_builder) has exactly this many ids; the tiny
# models' vocabulary matches it so every embedding row is reachable.
TOKENIZER_VOCAB_SIZE = 512


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder's shape and the few numbers its config.json adds (RoPE, norm epsilon)."""

    name: str
    model_type: str  # the Hugging Face family: qwen3 (q/k norm), qwen2 (q/k/v bias) or llama
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype: str  # the checkpoint's torch_dtype
    max_position_embeddings: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    source: str = ""  # where the numbers come from

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"ModelShape.model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"ModelShape.dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


def _qwen3(name: str, layers: int, hidden: int, heads: int, intermediate: int, tied: bool) -> ModelShape:
    # Qwen's published config.json; the four sizes share everything but these five numbers.
    return ModelShape(
        name=name, model_type="qwen3", num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=8,
        head_dim=128, intermediate_size=intermediate, vocab_size=151936, tie_word_embeddings=tied,
        dtype="bfloat16", max_position_embeddings=40960,
        source=f"https://huggingface.co/Qwen/{name.title()}/blob/main/config.json",
    )


def _tiny(name: str, model_type: str, **overrides) -> ModelShape:
    # Two layers over the project's tokenizer, in float32 so CPU runs are exact.
    base = dict(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
        vocab_size=TOKENIZER_VOCAB_SIZE, dtype="float32", max_position_embeddings=2048,
        source="test model of this project",
    )
    return ModelShape(name=name, model_type=model_type, **{**base, **overrides})


MODEL_SHAPES: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        _qwen3("qwen3-0.6b", 28, 1024, 16, 3072, tied=True),
        _qwen3("qwen3-4b", 36, 2560, 32, 9728, tied=True),
        _qwen3("qwen3-8b", 36, 4096, 32, 12288, tied=False),
        _qwen3("qwen3-32b", 64, 5120, 64, 25600, tied=False),
        # Tied embeddings and q/k norm, like Qwen3-0.6B.
        _tiny("tiny-qwen3", "qwen3", tie_word_embeddings=True),
        # Qwen2: bias on q/k/v, no q/k norm; untied so both head layouts are exercised.
        _tiny("tiny-qwen2", "qwen2", tie_word_embeddings=False),
        # Llama 3 style: no biases, no q/k norm, its own theta and eps.
        _tiny("tiny-llama", "llama", tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5,
              num_heads=8, head_dim=8),
    )
}

# Other spellings of these models (the underscored Hydra option names of earlier configs). They
# are refused with a pointer to the one spelling rather than served as aliases, so a config, a
# script or a results table never carries two names for one model.
RENAMED = {
    "qwen3_0_6b": "qwen3-0.6b", "qwen3_4b": "qwen3-4b", "qwen3_8b": "qwen3-8b", "qwen3_32b": "qwen3-32b",
    "tiny": "tiny-qwen3",
}


def model_shape(name: str) -> ModelShape:
    """The shape named `name`; ValueError names the right spelling or the known models."""
    if name in MODEL_SHAPES:
        return MODEL_SHAPES[name]
    if name in RENAMED:
        raise ValueError(f"model {name!r} is spelled {RENAMED[name]!r} (model={RENAMED[name]}, "
                         f"--preset {RENAMED[name]}, checkpoints/{RENAMED[name]}/)")
    raise ValueError(f"model {name!r} is unknown; expected one of {sorted(MODEL_SHAPES)}")
