"""Routers: which replica of a fleet serves an arriving request.

A router sees each replica through ReplicaLoad (what a load balancer in front of real servers
could know: the requests each one holds and the tokens they still need) and answers an index.
The same routers front simulated replicas and engine replicas (engine.core.fleet). A router is
built per run (make_router) and may keep state across calls (round-robin's cursor); nothing is
shared between runs. Each router registers its class in ROUTER_REGISTRY under the name
router.name takes, so adding one is one class and its registration.

What a router sees, per kind of fleet (tokens: engine.core.loop.tokens_left over the requests):
- engine replicas (run_fleet_wall; ReplicaView, a proxy's view): requests count from the moment
  they are dispatched until the replica reports them finished or rejected; tokens are those of
  the replica's latest report, sent after each of its steps, plus the requests dispatched since.
  A report is read when the router next looks, so the view is the replica as it was when its
  latest step ended (that step's tokens applied, the next one planned), tens of microseconds late.
- simulated replicas (run_fleet; the Replica itself): read at the arrival instant, once every
  replica has run the iteration that reaches it, so the view is the replica as it will be when
  the step running at the arrival ends: at most one step ahead of what the proxy knows.
Both count requests routed but not yet admitted, and identically when nothing has stepped since
the last routing (offline arrivals route the same in both: tests/core/test_remote_fleet.py).

Ties go to the lowest replica index, so a run is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

from engine.core.registry import Registry
from engine.core.request import Request


@dataclass(frozen=True)
class RouterConfig:
    """name: a registered router (ROUTERS). prefix_blocks and max_imbalance are read by prefix_affinity only.

    prefix_affinity hashes the prompt's first prefix_blocks full KV blocks (block_size tokens
    each; fewer when the prompt is shorter) and sends the request to replica hash % N, so
    requests that share those blocks meet the same prefix cache. NOTE: the target is overloaded
    when it holds max_imbalance or more requests beyond the least-loaded replica; the request
    then goes to the least-loaded replica (least_requests' rule), as does a prompt shorter than
    one block, which has no block to share.
    """

    name: str = "round_robin"
    prefix_blocks: int = 1
    max_imbalance: int = 16

    def __post_init__(self) -> None:
        ROUTER_REGISTRY.check(self.name)
        for field in ("prefix_blocks", "max_imbalance"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"router.{field} must be an int >= 1, got {value!r}")


class ReplicaLoad(Protocol):
    """What a router may read about one replica at the moment a request arrives."""

    def outstanding_requests(self) -> int:
        """Requests routed to it and not finished (queued, running, or not yet admitted)."""

    def outstanding_tokens(self) -> int:
        """Prompt tokens still to compute plus output tokens still to generate, over those requests."""


class Router(Protocol):
    def route(self, request: Request, replicas: Sequence[ReplicaLoad]) -> int: ...


class RegisteredRouter:
    """A router the registry can build: from_config makes a fresh one for a run (block_size: the
    KV cache's). A router with no settings is built by calling its class; one with settings names
    the RouterConfig fields it reads, so a setting no router in use reads is refused, not ignored."""

    settings: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: RouterConfig, block_size: int) -> Router:
        return cls()

    def route(self, request: Request, replicas: Sequence[ReplicaLoad]) -> int:
        raise NotImplementedError


ROUTER_REGISTRY: Registry[type[RegisteredRouter]] = Registry("router.name")


def _least(replicas: Sequence[ReplicaLoad], key: Callable[[ReplicaLoad], int]) -> int:
    return min(range(len(replicas)), key=lambda i: key(replicas[i]))


@ROUTER_REGISTRY.register("round_robin")
class RoundRobin(RegisteredRouter):
    def __init__(self) -> None:
        self._next = 0

    def route(self, request: Request, replicas: Sequence[ReplicaLoad]) -> int:
        index = self._next % len(replicas)
        self._next = index + 1
        return index


@ROUTER_REGISTRY.register("least_requests")
class LeastRequests(RegisteredRouter):
    def route(self, request: Request, replicas: Sequence[ReplicaLoad]) -> int:
        return _least(replicas, lambda r: r.outstanding_requests())


@ROUTER_REGISTRY.register("least_tokens")
class LeastTokens(RegisteredRouter):
    """KV-aware: the replica with the least work left in tokens (prompt to prefill + output to decode)."""

    def route(self, request: Request, replicas: Sequence[ReplicaLoad]) -> int:
        return _least(replicas, lambda r: r.outstanding_tokens())


@ROUTER_REGISTRY.register("prefix_affinity")
class PrefixAffinity(RegisteredRouter):
    """RouterConfig states the rule (hash of the first blocks; least_requests when overloaded)."""

    settings = ("prefix_blocks", "max_imbalance")

    @classmethod
    def from_config(cls, config: RouterConfig, block_size: int) -> Router:
        return cls(block_size, config.prefix_blocks, config.max_imbalance)

    def __init__(self, block_size: int, prefix_blocks: int, max_imbalance: int) -> None:
        self.block_size = block_size
        self.prefix_blocks = prefix_blocks
        self.max_imbalance = max_imbalance

    def affinity(self, request: Request, num_replicas: int) -> int | None:
        """The replica this prompt's first blocks belong to; None for a prompt shorter than a block."""
        num_full = min(self.prefix_blocks, request.num_prompt_tokens // self.block_size)
        if num_full == 0:
            return None
        prefix = request.token_ids[: num_full * self.block_size]
        digest = xxhash.xxh64_intdigest(b"".join(t.to_bytes(4, "little") for t in prefix))
        return digest % num_replicas

    def route(self, request: Request, replicas: Sequence[ReplicaLoad]) -> int:
        least = _least(replicas, lambda r: r.outstanding_requests())
        target = self.affinity(request, len(replicas))
        if target is None:
            return least
        overload = replicas[target].outstanding_requests() - replicas[least].outstanding_requests()
        return least if overload >= self.max_imbalance else target


def make_router(config: RouterConfig, block_size: int) -> Router:
    """A fresh router (its own state) for one run; block_size is the KV cache's (prefix_affinity)."""
    return ROUTER_REGISTRY.get(config.name).from_config(config, block_size)


# the names router.name accepts, in registration order
ROUTERS: tuple[str, ...] = ROUTER_REGISTRY.names()


def routers_reading(setting: str) -> list[str]:
    """The registered routers whose from_config reads a RouterConfig field other than name."""
    return [name for name in ROUTER_REGISTRY.names() if setting in ROUTER_REGISTRY.get(name).settings]
