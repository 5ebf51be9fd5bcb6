"""Trace replay for the demo: a stand-in latency model and a paced driver."""
