"""`specpilot demo`: the whole loop on one machine, with no cluster and no GPU."""
