"""Simulation: synthetic profiles from the digital twin (and, beside them, the fleet simulator)."""
