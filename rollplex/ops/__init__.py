"""Op costs: FLOP/byte/memory formulas (`formulas/`) bound to the graph's op kinds (`costs`)."""
