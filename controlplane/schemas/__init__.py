"""Pydantic wire models of the API (request bodies ``*Create``/``*Update``, responses
``*Public`` and pages ``*sPublic{data, count}``). ORM classes are never wire types."""
