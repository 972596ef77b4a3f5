"""Fleets: replicas behind a router, simulated on one event clock or served by engine processes."""
