"""Which replica notifies: leader election through a coordination.k8s.io/v1 Lease.

The algorithm is client-go's ``leaderelection`` with a ``LeaseLock``: every ``renew_interval_s``
each replica reads the Lease; the holder renews ``renewTime``; another replica takes the Lease
only when it is free or its ``renewTime`` is older than ``leaseDurationSeconds``. Writes carry
the ``resourceVersion`` read, so two replicas racing for the Lease cannot both win: the API
server answers the loser ``409 Conflict``. A leader that cannot renew within the lease duration
stops considering itself leader before anyone else may take over, and on shutdown it releases
the Lease (empty holder) so a peer takes over at once instead of after the lease expires.

When Kubernetes is not configured there is nobody to coordinate with: :class:`SoleLeader`
always leads. ::

    elector = LeaseElector.from_settings(settings.kubernetes, settings.daemon.leader_election)
    await elector.try_acquire_or_renew()     # every renew interval
    if elector.is_leader: ...
    await elector.release()                  # on shutdown
"""

from __future__ import annotations

import logging
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from diagnoser.config import KubernetesSettings, LeaderElectionSettings
from diagnoser.sources.base import run_blocking
from diagnoser.sources.kubernetes.credentials import Credentials, load_credentials

__all__ = ["LeaderElector", "LeaseElector", "SoleLeader", "elector_for"]

log = logging.getLogger(__name__)


class LeaderElector(Protocol):
    """What the daemon asks of leader election."""

    identity: str

    @property
    def is_leader(self) -> bool: ...

    async def try_acquire_or_renew(self) -> bool: ...

    async def release(self) -> None: ...

    def close(self) -> None: ...


class SoleLeader:
    """The only instance there is: always the leader."""

    def __init__(self, identity: str | None = None) -> None:
        self.identity = identity or socket.gethostname()

    @property
    def is_leader(self) -> bool:
        return True

    async def try_acquire_or_renew(self) -> bool:
        return True

    async def release(self) -> None:
        return None

    def close(self) -> None:
        return None


class LeaseElector:
    """Leader election on one Lease with the official ``kubernetes`` client (sync, in a thread)."""

    def __init__(self, api_client: Any, settings: LeaderElectionSettings, *, timeout_s: float = 5.0) -> None:
        from kubernetes import client as k8s_client

        self.settings = settings
        self.identity = settings.identity or socket.gethostname()
        self.timeout_s = timeout_s
        self._api = k8s_client.CoordinationV1Api(api_client)
        self._api_client = api_client
        #: Monotonic time of the last successful acquire or renew while holding the Lease.
        self._renewed_at: float | None = None
        #: (holder, renewTime) last observed, and when: how client-go judges expiry without
        #: trusting the other replica's clock.
        self._observed: tuple[str | None, str | None] = (None, None)
        self._observed_at = 0.0

    @classmethod
    def from_settings(
        cls,
        kubernetes: KubernetesSettings,
        settings: LeaderElectionSettings,
        *,
        credentials: Credentials | None = None,
    ) -> LeaseElector:
        """Over the Kubernetes source's ``credentials`` when given (read once), else loaded as for
        it (in-cluster or kubeconfig); ConfigError if they fail."""
        credentials = credentials or load_credentials(kubernetes, purpose="leader election")
        return cls(credentials.api_client(), settings, timeout_s=kubernetes.timeout_s)

    @property
    def is_leader(self) -> bool:
        # Leadership lapses by itself when renewals stop succeeding: a partitioned leader must
        # stop notifying before the Lease expires for the others.
        if self._renewed_at is None:
            return False
        return time.monotonic() - self._renewed_at < self.settings.lease_duration_s * 0.8

    async def try_acquire_or_renew(self) -> bool:
        """One round of the election; True when this replica holds the Lease afterwards."""
        try:
            won = await run_blocking(self._round)
        except Exception as exc:  # API unreachable, 403, garbage: stay (or become) a follower
            log.warning("leader election: %s: %s", type(exc).__name__, _short(exc))
            won = False
        if won:
            if self._renewed_at is None:
                log.info("leader election: %s is now the leader", self.identity)
            self._renewed_at = time.monotonic()
        elif self._renewed_at is not None and not self.is_leader:
            log.warning("leader election: %s lost the leadership", self.identity)
            self._renewed_at = None
        return self.is_leader

    async def release(self) -> None:
        """Give the Lease up (if held) so another replica can take over at once."""
        if self._renewed_at is None:
            return
        self._renewed_at = None
        try:
            await run_blocking(self._release)
            log.info("leader election: %s released the lease", self.identity)
        except Exception as exc:  # best effort: the Lease expires by itself anyway
            log.warning("leader election: could not release the lease: %s", _short(exc))

    def close(self) -> None:
        self._api_client.close()

    # --- in the worker thread -------------------------------------------------------------------

    def _now(self) -> datetime:
        return datetime.now(UTC)

    def _round(self) -> bool:
        from kubernetes import client as k8s_client
        from kubernetes.client.exceptions import ApiException

        name, namespace = self.settings.lease_name, self.settings.namespace
        duration = max(1, round(self.settings.lease_duration_s))
        try:
            lease = self._api.read_namespaced_lease(name, namespace, _request_timeout=self.timeout_s)
        except ApiException as exc:
            if exc.status != 404:
                raise
            now = self._now()
            body = k8s_client.V1Lease(
                api_version="coordination.k8s.io/v1",
                kind="Lease",
                metadata=k8s_client.V1ObjectMeta(name=name, namespace=namespace),
                spec=k8s_client.V1LeaseSpec(
                    holder_identity=self.identity,
                    lease_duration_seconds=duration,
                    acquire_time=now,
                    renew_time=now,
                    lease_transitions=0,
                ),
            )
            try:
                self._api.create_namespaced_lease(namespace, body, _request_timeout=self.timeout_s)
            except ApiException as create_exc:
                if create_exc.status == 409:  # another replica created it first
                    return False
                raise
            return True
        spec = lease.spec or k8s_client.V1LeaseSpec()
        holder = spec.holder_identity or None
        renew = spec.renew_time.isoformat() if spec.renew_time else None
        if (holder, renew) != self._observed:
            self._observed = (holder, renew)
            self._observed_at = time.monotonic()
        held_by_other = holder is not None and holder != self.identity
        if held_by_other:
            lease_s = spec.lease_duration_seconds or duration
            # Expiry is judged by how long *we* have seen the same renewTime, not by comparing
            # clocks with the holder's host.
            if time.monotonic() - self._observed_at < lease_s:
                return False
        now = self._now()
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = duration
        spec.renew_time = now
        lease.spec = spec
        try:
            self._api.replace_namespaced_lease(name, namespace, lease, _request_timeout=self.timeout_s)
        except ApiException as exc:
            if exc.status == 409:  # someone wrote the Lease since we read it
                return False
            raise
        return True

    def _release(self) -> None:
        from kubernetes.client.exceptions import ApiException

        name, namespace = self.settings.lease_name, self.settings.namespace
        lease = self._api.read_namespaced_lease(name, namespace, _request_timeout=self.timeout_s)
        if lease.spec is None or lease.spec.holder_identity != self.identity:
            return
        lease.spec.holder_identity = None
        lease.spec.lease_duration_seconds = 1
        lease.spec.renew_time = self._now() - timedelta(seconds=1)
        try:
            self._api.replace_namespaced_lease(name, namespace, lease, _request_timeout=self.timeout_s)
        except ApiException as exc:
            if exc.status != 409:
                raise


def _short(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return str(exc)[:200]


def elector_for(
    kubernetes: KubernetesSettings,
    settings: LeaderElectionSettings,
    *,
    credentials: Credentials | None = None,
) -> LeaderElector:
    """A Lease elector when Kubernetes is configured (unless disabled), else the sole leader."""
    enabled = settings.enabled if settings.enabled is not None else kubernetes.enabled
    if not enabled:
        return SoleLeader(settings.identity)
    return LeaseElector.from_settings(kubernetes, settings, credentials=credentials)
