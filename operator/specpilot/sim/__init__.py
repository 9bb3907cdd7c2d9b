"""Simulation: synthetic profiles from the digital twin, and the fleet simulator that runs the operator's pool
planner (`policy.planner.plan_pool`) through a simulated connector (`sim.connector`)."""
