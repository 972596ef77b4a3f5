"""Scheduling policies, by the name SchedulerConfig.policy takes, and make_scheduler().

A new policy is one file here: a Policy subclass (engine.core.policies.base) registered with
`@POLICIES.register("name")`, imported below so that the name is known wherever SchedulerConfig
is, and a conf/scheduler/<name>.yaml. sjf.py is a short example that only reorders the queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.async_scheduler import AsyncScheduler
from engine.core.policies.base import POLICIES, FcfsQueue, Policy, RequestQueue
from engine.core.policies.mixed import MixedPolicy
from engine.core.policies.nano import NanoPolicy
from engine.core.policies.sjf import ShortestJobFirstPolicy
from engine.core.scheduler import Scheduler

if TYPE_CHECKING:
    from engine.core.config import CacheConfig, SchedulerConfig
    from engine.core.executor import BackendInfo

__all__ = ["POLICIES", "FcfsQueue", "MixedPolicy", "NanoPolicy", "Policy", "RequestQueue", "ShortestJobFirstPolicy",
           "make_scheduler"]


def make_scheduler(config: SchedulerConfig, info: BackendInfo, cache_config: CacheConfig | None = None) -> Scheduler:
    """The scheduler for a backend described by info (its cache, its primary EOS id, whether its
    steps overlap), with the policy config.policy names."""
    policy = POLICIES.get(config.policy)()
    scheduler_class = AsyncScheduler if info.overlaps_steps else Scheduler
    prefix = True if cache_config is None else cache_config.enable_prefix_caching
    return scheduler_class(config, info.kv_cache_spec, policy, prefix, info.eos_token_id)
