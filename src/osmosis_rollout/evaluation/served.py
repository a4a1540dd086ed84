"""The server a run of ``osmosis test`` drives when the agent is not run in this process.

``--server URL`` names a running one; ``--launch CMD`` starts one for the run (``launch``) and
stops it on every way out, Ctrl-C included. Either way, a run given no ``--protocol`` asks the
server which wire it speaks (``wire_probe``, one ``GET /health``) and says which it uses, so a
server written with the official SDK is tested on its own wire with no flag. A run given
``--protocol`` reads it too, and warns at once when it shows another wire.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable

from .options import TestOptions

__all__ = ["served"]


@contextlib.asynccontextmanager
async def served(
    options: TestOptions,
    say: Callable[[str], None],
    warn: Callable[[str], None] | None = None,
) -> AsyncIterator[TestOptions]:
    """``options`` with ``server`` the URL to drive (a launched server's while it runs) and
    ``protocol`` a wire; unchanged for an in-process run. ``say`` hears which wire and why,
    ``warn`` (default: ``say``) that a given ``--protocol`` is not the wire ``/health`` shows."""
    warn = warn or say
    if options.launch is None:
        yield await _with_wire(options, say, warn)
        return
    from .launch import LaunchSpec, launch

    spec = options.launch
    if not isinstance(spec, LaunchSpec):
        spec = LaunchSpec(spec, echo=options.verbose)  # its output with --verbose
    async with launch(spec) as server:
        say(f"launched {spec.command!r} on {server.url} (pid {server.process.pid})")
        yield await _with_wire(dataclasses.replace(options, server=server.url), say, warn)


async def _with_wire(
    options: TestOptions, say: Callable[[str], None], warn: Callable[[str], None]
) -> TestOptions:
    """The wire asked of the server when none is given (the default wire in process); a given
    one is kept, with a warning when the server's ``/health`` shows another."""
    from ..testing.wire import WIRES, wire_names

    if options.server is None:
        if options.protocol is not None:
            return options
        return dataclasses.replace(options, protocol=WIRES[0].protocol)
    import httpx2

    from ..server.wire.polling import Polling
    from .wire_probe import probe_wire, wire_conflict

    polling = Polling.protocol  # the mock's twin carries the server side's name
    async with httpx2.AsyncClient() as http:
        probed = await probe_wire(http, options.server, api_key=options.api_key, polling=polling)
    if options.protocol is not None:
        conflict = wire_conflict(options.wire.protocol, probed, polling=polling)
        if conflict:
            warn(conflict)
        return options
    if probed.protocol not in wire_names():
        say(
            f"protocol: {probed.reason}, which this osmosis cannot speak yet; using "
            f"{WIRES[0].protocol} (give --protocol to choose)"
        )
        return dataclasses.replace(options, protocol=WIRES[0].protocol)
    say(f"protocol {probed.protocol}: {probed.reason} (--protocol chooses another)")
    return dataclasses.replace(options, protocol=probed.protocol)
