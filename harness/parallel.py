"""parallel_map: one function over many items, on this process, local cores (joblib) or Ray.

Hydra multiruns (`python -m harness -m ... hydra/launcher=joblib|ray`) already spread whole runs
over processes or a cluster. parallel_map is for work inside one run that fans out, such as a
deployment search evaluating many fleets: the caller names a backend, never a pool of its own.

- serial: a loop in this process (the reference: the others must return the same list);
- processes: worker processes on this machine (num_workers None: every core) that each receive fn
  once, when started (forked, on Linux: fn and what it holds are inherited, never pickled, which
  suits an fn bound to a large object such as a plan's prepared workload); items go one at a
  time to whichever worker is free, in the order given (the longest first keeps the cores busy
  to the end);
- joblib: joblib's process pool on this machine (loky; num_workers None: every core);
- ray: one Ray task per item on the cluster at `address` ("host:port" of a head started with
  `ray start --head`; None: the cluster this process already joined, else Ray's default, which
  joins a cluster started on this machine or starts a local one).

Results come back in input order. If items fail, the first failing one (in input order) is
re-raised with its index and repr in the message, as its own exception type where that type can be
rebuilt from a message (so a ConfigError stays a one-line user error), else as a RuntimeError.
fn and the items must pickle (a module-level function, not a lambda or a closure, for joblib/ray);
for processes only the items and results must, where processes are forked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

from harness.convert import ConfigError

BACKENDS = ("serial", "processes", "joblib", "ray")

T = TypeVar("T")
R = TypeVar("R")


class _Failure:
    """An exception caught inside a worker, carried back as a value so that every item is run."""

    __slots__ = ("error", "type_name")

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.type_name = type(error).__name__


def _attempt(fn: Callable[[T], R], item: T) -> R | _Failure:
    try:
        return fn(item)
    except Exception as error:  # noqa: BLE001 - re-raised in the caller, naming the item
        return _Failure(error)


def check_backend(backend: str, address: str | None = None, num_workers: int | None = None,
                  prefix: str = "parallel.") -> None:
    """Raise ConfigError (one line naming the field: <prefix>backend, ...) unless the settings name a
    usable backend."""
    if backend not in BACKENDS:
        raise ConfigError(f"{prefix}backend must be one of {BACKENDS}, got {backend!r}")
    if address is not None and (not isinstance(address, str) or not address):
        raise ConfigError(f"{prefix}address must be null or a non-empty 'host:port' string, got {address!r}")
    if address is not None and backend != "ray":
        raise ConfigError(f"{prefix}address={address!r} is only used by backend 'ray', got backend {backend!r}")
    if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, int)
                                    or num_workers < 1):
        raise ConfigError(f"{prefix}num_workers must be null or an int >= 1, got {num_workers!r}")
    if num_workers is not None and backend == "ray":
        raise ConfigError(f"{prefix}num_workers is not used by backend 'ray' (the cluster's CPUs decide); "
                          "leave it null")


def parallel_map(fn: Callable[[T], R], items: Iterable[T], backend: str = "serial", address: str | None = None,
                 num_workers: int | None = None, progress: bool = False, desc: str = "") -> list[R]:
    """[fn(item) for item in items], computed by `backend`; see the module docstring."""
    check_backend(backend, address, num_workers)
    items = list(items)
    if backend == "serial":
        outputs = [_attempt(fn, item) for item in tqdm(items, desc=desc, disable=not progress)]
    elif backend == "processes":
        outputs = _process_map(fn, items, num_workers, progress, desc)
    elif backend == "joblib":
        outputs = _joblib_map(fn, items, num_workers, progress, desc)
    else:
        outputs = _ray_map(fn, items, address, progress, desc)
    for index, (item, output) in enumerate(zip(items, outputs)):
        if isinstance(output, _Failure):
            raise _named(output.error, f"{backend} item {index} ({item!r})") from output.error
    return outputs


def _named(error: BaseException, where: str) -> BaseException:
    message = f"{where}: {error}"
    try:
        named = type(error)(message)
    except Exception:  # noqa: BLE001 - a constructor that takes more than a message
        return RuntimeError(f"{where}: {type(error).__name__}: {error}")
    return named if str(named) == message else RuntimeError(f"{where}: {type(error).__name__}: {error}")


def _process_map(fn: Callable[[T], R], items: list[T], num_workers: int | None, progress: bool,
                 desc: str) -> list[R | _Failure]:
    import multiprocessing
    import os
    from multiprocessing.connection import Connection, wait

    workers = min(num_workers or os.cpu_count() or 1, len(items))
    if workers <= 1:  # one worker would only add a process start
        return [_attempt(fn, item) for item in tqdm(items, desc=desc, disable=not progress)]
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    outputs: list[Any] = [None] * len(items)
    busy: dict[Connection, int] = {}  # a worker's pipe -> the index of the item it works on
    started = []
    todo = iter(range(len(items)))
    try:
        for _ in range(workers):
            ours, theirs = context.Pipe()
            process = context.Process(target=_work, args=(fn, theirs), daemon=True)
            process.start()
            theirs.close()
            started.append((process, ours))
            _give(ours, next(todo), items, busy)
        with tqdm(total=len(items), desc=desc, disable=not progress) as bar:
            while busy:
                for pipe in wait(list(busy)):
                    assert isinstance(pipe, Connection)
                    try:
                        outputs[busy.pop(pipe)] = pipe.recv()
                    except EOFError:
                        raise RuntimeError("a parallel_map worker process died (killed, or out of memory?)") from None
                    bar.update(1)
                    index = next(todo, None)
                    if index is not None:
                        _give(pipe, index, items, busy)
    finally:
        for process, pipe in started:
            if process.is_alive():
                try:
                    pipe.send(None)  # done: the worker returns
                except OSError:
                    process.terminate()
            pipe.close()
        for process, _ in started:
            process.join()
    return outputs


def _give(pipe: Any, index: int, items: list[Any], busy: dict[Any, int]) -> None:
    pipe.send(items[index])
    busy[pipe] = index


def _work(fn: Callable[[T], R], pipe: Any) -> None:
    """A process_map worker: fn of each item received, until None; a result that does not pickle
    comes back as a failure."""
    while (item := pipe.recv()) is not None:
        output = _attempt(fn, item)
        try:
            pipe.send(output)
        except Exception as error:  # noqa: BLE001 - re-raised in the caller, naming the item
            pipe.send(_Failure(RuntimeError(f"its result does not pickle: {error}")))


def _joblib_map(fn: Callable[[T], R], items: list[T], num_workers: int | None, progress: bool,
                desc: str) -> list[R | _Failure]:
    from joblib import Parallel, delayed

    # return_as="generator" yields in input order as results arrive, so the bar moves.
    runner = Parallel(n_jobs=num_workers or -1, return_as="generator")
    outputs = runner(delayed(_attempt)(fn, item) for item in items)
    return list(tqdm(outputs, total=len(items), desc=desc, disable=not progress))


def _ray_map(fn: Callable[[T], R], items: list[T], address: str | None, progress: bool,
             desc: str) -> list[R | _Failure]:
    import ray

    if not ray.is_initialized():
        # NOTE: left running after the map: a search calls parallel_map many times, and a Ray
        # start costs seconds. The driver process's exit disconnects it (or ray.shutdown()).
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    elif address is not None and not _joined(ray, address):
        raise ConfigError(f"parallel.address={address!r}: this process already joined another Ray cluster "
                          f"({ray.get_runtime_context().gcs_address})")
    task = ray.remote(_attempt)
    fn_ref = ray.put(fn)
    pending = [task.remote(fn_ref, item) for item in items]
    index_of = {ref: i for i, ref in enumerate(pending)}
    outputs: list[Any] = [None] * len(items)
    with tqdm(total=len(items), desc=desc, disable=not progress) as bar:
        waiting = list(pending)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            outputs[index_of[done[0]]] = ray.get(done[0])
            bar.update(1)
    return outputs


def _joined(ray: Any, address: str) -> bool:
    gcs = ray.get_runtime_context().gcs_address
    return address in ("auto", gcs) or address.removeprefix("ray://") == gcs
