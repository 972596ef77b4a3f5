"""The scheduler core: no torch, no hydra. Both backends meet it at engine.core.executor."""

from engine.core.block_manager import BlockManager
from engine.core.config import CacheConfig, ExecutionConfig, SchedulerConfig
from engine.core.executor import BackendInfo, Executor, PendingStep, StepHook, StepTiming, Unobserve
from engine.core.graph_sizes import GraphSizes
from engine.core.plan import KVCacheSpec, ScheduledRequest, StepPlan, StepResult, StepStats
from engine.core.policies import make_scheduler
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler

__all__ = [
    "BackendInfo", "BlockManager", "CacheConfig", "ExecutionConfig", "Executor", "FinishReason", "GraphSizes",
    "KVCacheSpec", "PendingStep", "Request", "RequestStatus", "SamplingParams", "ScheduledRequest", "Scheduler",
    "SchedulerConfig", "StepHook", "StepPlan", "StepResult", "StepStats", "StepTiming", "Unobserve", "make_scheduler",
]
