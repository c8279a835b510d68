"""Op kinds: schema, FLOP/byte/memory formulas and the registry."""
