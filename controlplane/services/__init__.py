"""Use cases of the registry. Each takes an ``AsyncSession`` already inside a transaction
(one unit of work per request or CLI command) and never commits it; mutations write their
audit entry in the same session. Modules: ``slos``, ``keys``, ``audit``, ``fleet``, and
``rollups`` (the goodput engine's stored history)."""
