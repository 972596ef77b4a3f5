"""experiment=fidelity: the held-out protocol (workload classes x loads, engine vs simulator)."""
