"""Workloads: seeded synthetic requests, trace replay and shared-prefix groups."""

from harness.workloads.build import Workload, build_workload, fit_warnings_muted
from harness.workloads.config import LengthConfig, SharedPrefixConfig, WorkloadConfig
from harness.workloads.trace import DEFAULT_TRACE_DIR, TraceError, read_trace, resolve_trace_path

__all__ = [
    "DEFAULT_TRACE_DIR", "LengthConfig", "SharedPrefixConfig", "TraceError", "Workload", "WorkloadConfig",
    "build_workload", "fit_warnings_muted", "read_trace", "resolve_trace_path",
]
