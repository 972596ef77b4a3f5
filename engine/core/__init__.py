"""The scheduler core: no torch, no hydra. Both backends drive it through engine.core.plan."""

from engine.core.block_manager import BlockManager
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.plan import Executor, KVCacheSpec, ScheduledRequest, StepPlan, StepResult, StepStats
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, make_scheduler

__all__ = [
    "BlockManager", "CacheConfig", "Executor", "FinishReason", "KVCacheSpec", "Request",
    "RequestStatus", "SamplingParams", "ScheduledRequest", "Scheduler", "SchedulerConfig",
    "StepPlan", "StepResult", "StepStats", "make_scheduler",
]
