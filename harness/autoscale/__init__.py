"""Autoscaling: policies that size an elastic simulated fleet over time, its per-window outputs and
costs, and experiment=autoscale (the cheapest static fleet beside each policy)."""
