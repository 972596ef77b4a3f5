"""The offline API: LLM(model_dir, **config).generate(prompts, sampling_params).

    llm = LLM("/ckpt/tiny-qwen3", max_model_len=512, block_size=16)
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=16))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason, outs[1].error

One scheduler lives as long as the LLM, so the prefix cache carries over between calls; each
call serves its prompts to completion through the core's step loop on the wall clock.
"""

from __future__ import annotations

import dataclasses
import numbers
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from engine.config import EngineConfig
from engine.core.config import CacheConfig, ExecutionConfig, SchedulerConfig
from engine.core.loop import RunResult, StepRecord, WallClock, run
from engine.core.model_shapes import ModelShape
from engine.core.policies import make_scheduler
from engine.core.request import FinishReason, Request
from engine.core.sampling_params import SamplingParams
from engine.dummy import dummy_model_folder
from engine.executor import EngineExecutor
from engine.outputs import RequestOutput, ThroughputMeter
from engine.preflight import max_position_embeddings

_CONFIGS = (EngineConfig, ExecutionConfig, SchedulerConfig, CacheConfig)
_FIELDS = {cls: {f.name for f in dataclasses.fields(cls)} - {"model", "execution"} for cls in _CONFIGS}


def split_kwargs(kwargs: dict[str, Any]) -> tuple[dict, dict, dict, dict]:
    """Route LLM() keyword arguments to EngineConfig, ExecutionConfig, SchedulerConfig and CacheConfig."""
    parts: tuple[dict, dict, dict, dict] = ({}, {}, {}, {})
    for name, value in kwargs.items():
        for part, cls in zip(parts, _CONFIGS):
            if name in _FIELDS[cls]:
                part[name] = value
                break
        else:
            allowed = sorted(set().union(*_FIELDS.values()))
            raise TypeError(f"LLM() got an unexpected keyword argument {name!r}; allowed: {', '.join(allowed)}")
    return parts


class LLM:
    """A model served by the engine; see the module docstring. Keyword arguments are the fields
    of EngineConfig (dtype, device, attention_backend, fused_kernels, balanced_decode), ExecutionConfig
    (enforce_eager, async_scheduling, prefill_graph_tokens, max_graph_batch_size,
    tensor_parallel_size, all_reduce, seed, gpu_memory_utilization), SchedulerConfig (policy,
    max_num_seqs, max_num_batched_tokens, max_model_len, enable_chunked_prefill) and CacheConfig
    (block_size, num_blocks, enable_prefix_caching). max_model_len defaults to the smaller of SchedulerConfig's default
    and the model's max_position_embeddings; max_num_seqs to the smaller of its default and
    max_num_batched_tokens.
    """

    def __init__(self, model: str | Path | ModelShape, **kwargs: Any) -> None:
        engine_kw, execution_kw, scheduler_kw, cache_kw = split_kwargs(kwargs)
        if engine_kw.get("load_format") == "dummy":  # a preset name or a ModelShape: random weights
            model = dummy_model_folder(model, self)
        elif isinstance(model, ModelShape):
            raise ValueError("LLM(ModelShape) needs load_format='dummy' (random weights); "
                             "otherwise pass a checkpoint folder")
        model = str(model)
        max_positions = max_position_embeddings(model)
        # a larger explicit max_model_len is refused by EngineExecutor, for every caller
        if max_positions is not None and "max_model_len" not in scheduler_kw:
            scheduler_kw["max_model_len"] = min(SchedulerConfig.max_model_len, max_positions)
        budget = scheduler_kw.get("max_num_batched_tokens")
        if "max_num_seqs" not in scheduler_kw and _is_int(budget) and budget < SchedulerConfig.max_num_seqs:
            scheduler_kw["max_num_seqs"] = max(budget, 1)  # a small budget alone should not be an error
        self.engine_config = EngineConfig(model=model, execution=ExecutionConfig(**execution_kw), **engine_kw)
        self.scheduler_config = SchedulerConfig(**scheduler_kw)
        self.cache_config = CacheConfig(**cache_kw)
        self.executor = EngineExecutor(self.engine_config, self.scheduler_config, self.cache_config)
        self.scheduler = make_scheduler(self.scheduler_config, self.executor.info(), self.cache_config)
        self.last_run: RunResult | None = None  # steps and timings of the latest generate()
        self._next_id = 0
        self._shut_down = False

    @property
    def tokenizer(self):
        return self.executor.tokenizer

    def generate(
        self,
        prompts: str | list[int] | list[str | list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for each prompt; returns one RequestOutput per prompt, in input order.

        A prompt is a string (tokenized with the checkpoint's tokenizer) or a list of token ids.
        A bad prompt (empty, wrong type, text for a checkpoint without a tokenizer, token ids
        outside [0, vocab_size), too long for max_model_len) comes back with `error` set while
        the others are served. A max_tokens that max_model_len leaves no room for is cut to what
        it leaves (finish_reason "length"), as vLLM does. Raises ValueError for an empty prompt
        list or a sampling_params list of the wrong length, TypeError for arguments of the wrong
        type, RuntimeError after shutdown().
        """
        if self._shut_down:
            raise RuntimeError("LLM.generate() after LLM.shutdown(): the model is released; make a new LLM")
        batch = _as_batch(prompts)
        params = _per_prompt(sampling_params, len(batch))
        outputs: list[RequestOutput] = []
        requests: list[Request] = []
        asked: dict[str, SamplingParams] = {}  # the caller's own params, for stop_reason
        for prompt, sp in zip(batch, params):
            rid = str(self._next_id)
            self._next_id += 1
            token_ids, error = self._encode(prompt)
            outputs.append(RequestOutput(rid, prompt if isinstance(prompt, str) else None, token_ids, error=error))
            if error is None:
                asked[rid] = sp
                requests.append(Request(rid, token_ids, self._with_eos_stops(self._fit_length(sp, len(token_ids)))))
        bar = tqdm(total=len(requests), desc="Generating", unit="req", dynamic_ncols=True, disable=not use_tqdm)
        meter = ThroughputMeter()
        by_id = {out.request_id: out for out in outputs}

        def on_step(record: StepRecord, finished: list[Request]) -> None:
            meter.add(record.stats, record.duration_s)
            bar.set_postfix_str(meter.describe(), refresh=False)
            bar.update(len(finished))
            # Detokenized here, as each request finishes: with overlapped steps the device is
            # already running the next step, so the text costs no time at the end of the run.
            for request in finished:
                self._fill(by_id[request.request_id], request, asked[request.request_id])

        try:
            result = run(self.scheduler, self.executor, requests, WallClock(), on_step)
        except BaseException:
            # Leave the scheduler clean for the next call: nothing of this one may linger.
            for request in requests:
                self.scheduler.abort(request.request_id)
            raise
        else:
            bar.update(len(result.rejected))  # rejected at admission: done, though never stepped
        finally:
            bar.close()
        self.last_run = result
        for rid, error in result.rejected.items():
            by_id[rid].error = error
        return outputs

    def _fill(self, out: RequestOutput, request: Request, asked: SamplingParams) -> None:
        out.token_ids = list(request.output_token_ids)  # (a simulated request may hold packed ids)
        reason = request.finish_reason
        # vLLM's names: an end-of-sequence token is a "stop" too, told apart by stop_reason None
        out.finish_reason = "stop" if reason in (FinishReason.EOS, FinishReason.STOP) else \
            reason.value if reason else None
        last = out.token_ids[-1] if out.token_ids else None
        # a checkpoint's second eos id ends as a stop token (_with_eos_stops) but is no stop_reason
        out.stop_reason = last if reason is FinishReason.STOP and last in asked.stop_token_ids else None
        tokenizer = self.tokenizer  # a checkpoint without one gives token ids only, text ""
        out.text = "" if tokenizer is None else tokenizer.decode(out.token_ids, skip_special_tokens=True)
        out.num_cached_tokens = request.num_cached_tokens
        out.num_preemptions = request.num_preemptions

    def shutdown(self) -> None:
        self.executor.shutdown()
        self._shut_down = True

    # ---- helpers ---------------------------------------------------------------------------

    def _encode(self, prompt: object) -> tuple[list[int], str | None]:
        """Token ids of one prompt, or the reason it cannot be served."""
        if isinstance(prompt, str):
            if not prompt:
                return [], "empty prompt: at least one token is needed"
            if self.tokenizer is None:
                return [], f"a text prompt needs a tokenizer and {self.engine_config.model} has none: pass token ids"
            token_ids = list(self.tokenizer.encode(prompt))
        elif isinstance(prompt, (list, tuple)):
            for i, token in enumerate(prompt):
                if isinstance(token, bool) or not isinstance(token, numbers.Integral):
                    return [], (f"prompt must be a str or a list of int token ids; element {i} is "
                                f"{type(token).__name__}")
            token_ids = [int(t) for t in prompt]
        else:
            return [], f"prompt must be a str or a list of int token ids, got {type(prompt).__name__}"
        if not token_ids:
            return [], "empty prompt: at least one token is needed"
        vocab = self.executor.info().vocab_size
        bad = next((i for i, t in enumerate(token_ids) if not 0 <= t < vocab), None)
        if bad is not None:
            return token_ids, (f"token id {token_ids[bad]} at position {bad} is outside the vocabulary "
                               f"[0, {vocab})")
        return token_ids, None

    def _fit_length(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        # A prompt that leaves no room at all stays as it is, for admission to reject it.
        room = self.scheduler_config.max_model_len - prompt_len
        if params.max_tokens is None or params.max_tokens <= room or room < 1:
            return params
        return dataclasses.replace(params, max_tokens=room, min_tokens=min(params.min_tokens, room))

    def _with_eos_stops(self, params: SamplingParams) -> SamplingParams:
        # The scheduler stops on one eos id; the checkpoint's others become stop tokens.
        extra = [t for t in self.executor.info().eos_token_ids[1:] if t not in params.stop_token_ids]
        if params.ignore_eos or not extra:
            return params
        return dataclasses.replace(params, stop_token_ids=params.stop_token_ids + tuple(extra))


def _as_batch(prompts: object) -> list[object]:
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a str, a list of token ids, or a list of those; got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts is empty: generate() needs at least one prompt")
    if all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompts):
        return [list(prompts)]  # one prompt given as token ids
    return list(prompts)


def _per_prompt(sampling_params: object, n: int) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    if not isinstance(sampling_params, (list, tuple)):
        raise TypeError(f"sampling_params must be a SamplingParams or a list of them, got "
                        f"{type(sampling_params).__name__}")
    if len(sampling_params) != n:
        raise ValueError(f"sampling_params has {len(sampling_params)} entries for {n} prompts; "
                         "give one per prompt or a single SamplingParams")
    for i, sp in enumerate(sampling_params):
        if not isinstance(sp, SamplingParams):
            raise TypeError(f"sampling_params[{i}] must be a SamplingParams, got {type(sp).__name__}")
    return list(sampling_params)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
