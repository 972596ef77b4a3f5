"""An OpenAI-compatible HTTP server over the engine or the simulator (`python -m harness.serve`).

core: the loop thread that owns the scheduler and the executor; app: the routes; generation: one
request's text; protocol: the request bodies; metrics: /metrics; server: wiring and outputs.
"""
