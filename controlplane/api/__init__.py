"""The HTTP API: ``auth`` (keys and roles), ``deps`` (dependency aliases), ``routes``."""
