"""The server a run of ``osmosis test`` drives when the agent is not run in this process.

``--server URL`` names a running one; ``--launch CMD`` starts one for the run (``launch``) and
stops it on every way out, Ctrl-C included. Either way, a run given no ``--protocol`` asks the
server which wire it speaks (``wire_probe``, one ``GET /health``) and says which it uses, so a
server written with the official SDK is tested on its own wire with no flag.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable

from .options import TestOptions

__all__ = ["served"]


@contextlib.asynccontextmanager
async def served(options: TestOptions, say: Callable[[str], None]) -> AsyncIterator[TestOptions]:
    """``options`` with ``server`` the URL to drive (a launched server's while it runs) and
    ``protocol`` a wire; unchanged for an in-process run. ``say`` hears which wire and why."""
    if options.launch is None:
        yield await _with_wire(options, say)
        return
    from .launch import LaunchSpec, launch

    spec = options.launch
    if not isinstance(spec, LaunchSpec):
        spec = LaunchSpec(spec)
    async with launch(spec) as server:
        say(f"launched {spec.command!r} on {server.url} (pid {server.process.pid})")
        yield await _with_wire(dataclasses.replace(options, server=server.url), say)


async def _with_wire(options: TestOptions, say: Callable[[str], None]) -> TestOptions:
    """The wire asked of the server when none is given (the default wire in process)."""
    from ..testing.wire import WIRES, wire_names

    if options.protocol is not None:
        return options
    if options.server is None:
        return dataclasses.replace(options, protocol=WIRES[0].protocol)
    import httpx2

    from ..server.wire.polling import Polling
    from .wire_probe import probe_wire

    polling = Polling.protocol  # the mock's twin carries the server side's name
    async with httpx2.AsyncClient() as http:
        probed = await probe_wire(http, options.server, api_key=options.api_key, polling=polling)
    if probed.protocol not in wire_names():
        say(
            f"protocol: {probed.reason}, which this osmosis cannot speak yet; using "
            f"{WIRES[0].protocol} (give --protocol to choose)"
        )
        return dataclasses.replace(options, protocol=WIRES[0].protocol)
    say(f"protocol {probed.protocol}: {probed.reason} (--protocol chooses another)")
    return dataclasses.replace(options, protocol=probed.protocol)
