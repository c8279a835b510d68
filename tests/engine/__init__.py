"""Tests of the decode engine (rollplex/engine)."""
