"""The engine backend. `from engine import LLM, SamplingParams`.

LLM is loaded lazily so that `engine.core` (and the simulator, which uses only the core)
never imports torch.
"""

from engine.core.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
