"""The original SDK's (v1, ``osmosis_ai.rollout``) names, as thin views over our core.

A v1 agent project runs after changing ``osmosis_ai.rollout`` to ``osmosis_rollout`` in its
imports: every v1 name is re-exported lazily from ``osmosis_rollout``. This package owns the
names that have no counterpart in our API (typed tool classes, the registry, the helper
functions, ``OsmosisLLMClient``, the sync ``validate_agent_loop``, ``serve_agent_loop`` and the
v1-shaped ``create_app``); everything else (``RolloutContext``, ``RolloutResult``, the
exceptions...) is our own class, which keeps v1's contract. ``docs/migrating-from-v1.md`` lists
every deliberate difference.

Nothing is imported here, so that importing one submodule stays cheap.
"""
