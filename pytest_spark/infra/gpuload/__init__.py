"""A short GPU load on each node before serving: SM clock, power, temperature under it."""
