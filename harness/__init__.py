"""The Hydra harness: `python -m harness` runs workloads on the simulator or the engine."""
