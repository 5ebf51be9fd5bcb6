"""Pure control-loop policies: functions of observed state and an injected clock, no I/O
(docs/architecture.md: the simulator imports them, so no FastAPI, SQLAlchemy or network here)."""
