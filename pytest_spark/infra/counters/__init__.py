"""Fabric error counters (ethtool -S, RoCE hw_counters) read before and after the traffic
the suite sends (the all-reduce run, the throughput sweep): any rise is a bad link."""
