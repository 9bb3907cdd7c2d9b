"""Simulation: synthetic profiles from the digital twin, and the fleet simulator that runs the operator's decision
(`policy.plan.plan_deployment`) through a simulated connector (`sim.connector`)."""
