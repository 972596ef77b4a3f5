"""The one description of a model: its shape, the architecture it belongs to, and every named model.

ModelShape is what a Hugging Face config.json says about a dense decoder, in this project's
names. Everything else derives from it: the simulator's sim.specs.ModelSpec (a ModelShape plus
the KV cache's setting), the config.json the checkpoint writer ships (engine.models.presets), and
the engine, which reads a checkpoint's config.json with ModelShape.from_hf_config and builds the
class that ARCHITECTURES names for its model_type. Plain data, so the simulator reads it without
torch.

A name in MODEL_SHAPES is the model's only spelling. It is the Hydra option (`model=qwen3-0.6b`,
file conf/model/qwen3-0.6b.yaml), the checkpoint preset (`python -m engine.checkpoint --preset
qwen3-0.6b`) and the folder of its random-weight checkpoint (`checkpoints/qwen3-0.6b/`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from engine.core.architectures import ARCHITECTURES, Architecture
from engine.core.hf_config import DTYPE_BYTES, HasToDict, shape_fields

# The project's own tokenizer (engine.tokenizer_builder) has exactly this many ids; the tiny
# models' vocabulary matches it so every embedding row is reachable.
TOKENIZER_VOCAB_SIZE = 512


def check_positive(owner: str, name: str, value: Any, types: tuple[type, ...]) -> None:
    """TypeError unless value is one of types (never a bool), ValueError unless it is > 0."""
    is_number = not isinstance(value, bool) and isinstance(value, types)
    if not is_number:
        allowed = " or ".join(t.__name__ for t in types)
        raise TypeError(f"{owner}.{name} must be {allowed}, got {type(value).__name__} ({value!r})")
    if not value > 0:
        raise ValueError(f"{owner}.{name} must be > 0, got {value!r}")


S = TypeVar("S", bound="ModelShape")
_INT_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
               "vocab_size", "max_position_embeddings")


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder's shape and the few numbers its config.json adds (RoPE, norm epsilon).

    The defaults are what a config.json that leaves a key out means (the Hugging Face classes'
    defaults, as the engine has always read them)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    model_type: str = "qwen3"  # the Hugging Face family, a name of ARCHITECTURES
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"  # the checkpoint's torch_dtype
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False  # q, k, v and o carry a bias (families with that switch)
    mlp_bias: bool = False  # gate, up and down carry a bias (families with that switch)
    # Mixture of experts (Hugging Face's Qwen3-MoE names). num_experts 0 is a dense model. Layer i
    # routes each token to num_experts_per_tok of num_experts SwiGLU experts of width
    # moe_intermediate_size when (i + 1) % decoder_sparse_step == 0 and i is not in
    # mlp_only_layers; other layers keep the dense MLP of width intermediate_size.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    norm_topk_prob: bool = True  # renormalise the chosen experts' router weights to sum to 1
    source: str = field(default="", compare=False)  # where the numbers come from

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in _INT_FIELDS:
            check_positive(owner, name, getattr(self, name), (int,))
        for name in ("rope_theta", "rms_norm_eps"):
            check_positive(owner, name, getattr(self, name), (int, float))
        if self.model_type not in ARCHITECTURES:
            raise ValueError(f"{owner}.{ARCHITECTURES.unknown(self.model_type)}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"{owner}.dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{owner}.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention")
        for switch in ("attention_bias", "mlp_bias"):
            if getattr(self, switch) and switch not in self.architecture.config_keys:
                raise ValueError(f"{owner}.{switch}: a {self.model_type} model has no such switch; expected false")
        self._check_experts(owner)

    def _check_experts(self, owner: str) -> None:
        layers: object = self.mlp_only_layers
        if isinstance(layers, list):  # a YAML list; the field is a tuple
            object.__setattr__(self, "mlp_only_layers", tuple(layers))
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{owner}.{name} must be an int >= 0, got {value!r}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"{owner}.num_experts_per_tok ({self.num_experts_per_tok}) must not exceed "
                             f"num_experts ({self.num_experts})")
        if not self.num_experts:
            return
        if not self.architecture.moe:
            raise ValueError(f"{owner}.num_experts: a {self.model_type} model has no experts; expected 0 "
                             f"(mixture-of-experts types: {[n for n, a in ARCHITECTURES.items() if a.moe]})")
        check_positive(owner, "num_experts_per_tok", self.num_experts_per_tok, (int,))
        check_positive(owner, "moe_intermediate_size", self.moe_intermediate_size, (int,))
        check_positive(owner, "decoder_sparse_step", self.decoder_sparse_step, (int,))
        outside = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
        if outside:
            raise ValueError(f"{owner}.mlp_only_layers {outside} are not layers of a {self.num_layers}-layer model")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer `layer` (0-based) routes tokens to experts (Qwen3-MoE's rule)."""
        return (self.is_moe and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def architecture(self) -> Architecture:
        return ARCHITECTURES.get(self.model_type)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def qk_norm(self) -> bool:
        return self.architecture.qk_norm

    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias or self.architecture.fixed_qkv_bias

    @property
    def o_bias(self) -> bool:
        return self.attention_bias

    @classmethod
    def from_hf_config(cls: type[S], config: Mapping[str, Any] | HasToDict, name: str | None = None) -> S:
        """Read a Hugging Face config.json (the dict, or a transformers PretrainedConfig); ValueError
        names what this project cannot serve. A key left out means the field's default
        (engine.core.hf_config)."""
        return cls(**shape_fields(config, name, {f.name: f.default for f in fields(cls)}))


def _qwen3(name: str, layers: int, hidden: int, heads: int, intermediate: int, tied: bool) -> ModelShape:
    # Qwen's published config.json; the four sizes share everything but these five numbers.
    return ModelShape(
        name=name, model_type="qwen3", num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=8,
        head_dim=128, intermediate_size=intermediate, vocab_size=151936, tie_word_embeddings=tied,
        dtype="bfloat16", max_position_embeddings=40960, rope_theta=1_000_000.0,
        source=f"https://huggingface.co/Qwen/{name.title()}/blob/main/config.json",
    )


def _qwen3_moe(name: str, hf_name: str, layers: int, hidden: int, heads: int, intermediate: int,
               moe_intermediate: int) -> ModelShape:
    # Qwen's published config.json of the mixtures of experts: 128 experts, 8 per token, every
    # layer sparse, the top-8 weights renormalised.
    return ModelShape(
        name=name, model_type="qwen3_moe", num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=4,
        head_dim=128, intermediate_size=intermediate, vocab_size=151936, tie_word_embeddings=False,
        dtype="bfloat16", max_position_embeddings=40960, rope_theta=1_000_000.0, num_experts=128,
        num_experts_per_tok=8, moe_intermediate_size=moe_intermediate, decoder_sparse_step=1, mlp_only_layers=(),
        norm_topk_prob=True, source=f"https://huggingface.co/Qwen/{hf_name}/blob/main/config.json",
    )


def _tiny(name: str, model_type: str, **overrides: Any) -> ModelShape:
    # Two layers over the project's tokenizer, in float32 so CPU runs are exact.
    base: dict[str, Any] = dict(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
        vocab_size=TOKENIZER_VOCAB_SIZE, dtype="float32", max_position_embeddings=2048, rope_theta=1_000_000.0,
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
        _qwen3_moe("qwen3-30b-a3b", "Qwen3-30B-A3B", 48, 2048, 32, 6144, 768),
        _qwen3_moe("qwen3-235b-a22b", "Qwen3-235B-A22B", 94, 4096, 64, 12288, 1536),
        # Tied embeddings and q/k norm, like Qwen3-0.6B.
        _tiny("tiny-qwen3", "qwen3", tie_word_embeddings=True),
        # Qwen2: bias on q/k/v, no q/k norm; untied so both head layouts are exercised.
        _tiny("tiny-qwen2", "qwen2", tie_word_embeddings=False),
        # Llama 3 style: no biases, no q/k norm, its own theta and eps.
        _tiny("tiny-llama", "llama", tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5,
              num_heads=8, head_dim=8),
        # Qwen3-MoE: layer 0 keeps the dense MLP (mlp_only_layers), layers 1 and 2 route each token
        # to 2 of 8 experts; untied, like Qwen3-30B-A3B.
        _tiny("tiny-qwen3-moe", "qwen3_moe", num_layers=3, tie_word_embeddings=False, num_experts=8,
              num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=(0,)),
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
