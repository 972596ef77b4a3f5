"""Studies over one parameter: a sweep (one run per value) and a capacity search (a rate per value)."""
