"""The calculator, held at the rows marked ``wait`` until a gate file exists: a run that is
interrupted while they wait, then resumed once the gate is open."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "calculator"))

from agent import CalculatorAgent

from osmosis_rollout import RolloutContext, RolloutResult


class GatedCalculator(CalculatorAgent):
    name = "gated-calculator"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        if ctx.request.metadata.get("wait"):
            while not os.path.exists(os.environ["RESUME_GATE"]):
                await anyio.sleep(0.02)
        return await super().run(ctx)
