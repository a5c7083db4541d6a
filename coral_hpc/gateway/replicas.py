"""The gateway's side of each replica: its pool of upstream connections, and its health (taken
out after a failure, back in when its ``/health`` answers again).

A prober checks every replica's ``/health`` each ``probe_interval_s``; a refused connection or an
error answer takes a replica out at once, a late answer only after
``probe_timeouts_to_mark_down`` of them in a row (a replica busy with a burst is slow, not dead).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from coral_hpc.gateway.routing import ReplicaState, Router
from coral_hpc.gateway.settings import GatewaySettings
from coral_hpc.gateway.upstream import UpstreamPool

log = logging.getLogger("coral_hpc.gateway")


class Replicas:
    """Upstream pools and health of the router's replicas. :meth:`start` before the prober runs;
    :meth:`stop` closes every connection."""

    def __init__(self, settings: GatewaySettings, router: Router) -> None:
        self.settings = settings
        self.router = router
        self._pools: dict[ReplicaState, UpstreamPool] = {}
        self._probe_timeouts: dict[ReplicaState, int] = {}
        self._probe_session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the prober's HTTP session."""
        self._probe_session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.settings.probe_timeout_s),
            connector=aiohttp.TCPConnector(limit=64, force_close=True),
        )

    async def stop(self) -> None:
        """Close every upstream connection and the prober's session."""
        for pool in list(self._pools.values()):
            pool.close()
        self._pools.clear()
        if self._probe_session is not None:
            await self._probe_session.close()

    # ------------------------------------------------------------------ connections

    def pool(self, state: ReplicaState) -> UpstreamPool:
        """The replica's connection pool, made on its first request."""
        pool = self._pools.get(state)
        if pool is None:
            s = self.settings
            pool = self._pools[state] = UpstreamPool(
                state.url, s.connect_timeout_s, s.read_timeout_s,
                max_connections=s.max_connections_per_replica,
                keepalive_s=s.upstream_keepalive_s, max_idle=s.max_idle_per_replica)
        return pool

    def done_with(self, state: ReplicaState) -> None:
        """A request to ``state`` has finished; a replica gone from the table closes with its
        last one."""
        state.outstanding -= 1
        if state.removed and state.outstanding == 0:
            self.close(state)

    def close(self, state: ReplicaState) -> None:
        """Forget a replica that left the table: close its connections."""
        self._probe_timeouts.pop(state, None)
        pool = self._pools.pop(state, None)
        if pool is not None:
            pool.close()

    def reap_idle(self) -> None:
        """Close idle connections past their keep-alive (a background step, every second)."""
        for pool in self._pools.values():
            pool.reap()

    # ------------------------------------------------------------------ health

    def mark_down(self, state: ReplicaState, why: str) -> None:
        """Take a replica out of routing until its ``/health`` answers again."""
        if state.healthy:
            log.warning("replica %s of %s (%s) taken out: %s", state.id, state.model, state.url,
                        why)
        state.healthy = False

    async def probe_all(self) -> None:
        """Check every replica in the table (the prober's step)."""
        states = [s for states in self.router.models.values() for s in states]
        if states:
            await asyncio.gather(*(self._probe(s) for s in states))

    async def _probe(self, state: ReplicaState) -> None:
        session = self._probe_session
        assert session is not None  # made by start(), before the prober runs
        timed_out = False
        try:
            async with session.get(state.url + "/health") as resp:
                ok = resp.status == 200
        except asyncio.TimeoutError:
            ok, timed_out = False, True
        except (aiohttp.ClientError, OSError):
            ok = False
        if state.removed:
            return
        if ok:
            self._probe_timeouts.pop(state, None)
            if not state.healthy:
                log.info("replica %s of %s answers /health again; back in", state.id,
                         state.model)
                state.healthy = True
            return
        if timed_out:
            # A replica busy with a burst answers /health late: slow, not dead, and taking it
            # out would turn the burst into 503s (bench/results/gateway_soak.md). Out only when
            # it stays silent; a refused connection or an error answer takes it out at once.
            late = self._probe_timeouts[state] = self._probe_timeouts.get(state, 0) + 1
            if late < self.settings.probe_timeouts_to_mark_down:
                return
        self.mark_down(state, "/health timed out" if timed_out else "/health did not answer 200")
