"""The mock LLM's samplers: schema-valid tool arguments (private to ``osmosis_rollout.testing``).

``schema_instances.generate`` is the entry point; the other modules are its parts (keywords,
strings, regular expressions) and import each other's public names only.
"""
