"""experiment=compare: one workload on the engine, then on the simulator, side by side."""
