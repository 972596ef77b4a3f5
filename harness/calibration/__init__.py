"""Profiling an engine and fitting the profiled cost model: the step grid, its timings, the fit."""
