"""A per-rollout OpenAI-compatible chat endpoint over ``ctx.chat`` (docs/bring-your-own-agent.md):
``translate`` (bodies to and from a turn), ``session`` (one rollout's endpoint and findings),
``inprocess`` (the socketless ``openai`` client), ``listener`` (loopback, per-rollout tokens),
``door`` (what the context gains). Internal: agents reach it through ``ctx.openai_client()``,
``ctx.openai_base_url`` and ``ctx.openai_api_key``."""
