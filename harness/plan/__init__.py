"""experiment=plan: the cheapest deployment meeting an SLO, searched by simulation."""
