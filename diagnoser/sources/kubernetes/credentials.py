"""Kubernetes credentials: in-cluster or kubeconfig, loaded into one client ``ApiClient``.

The Kubernetes source and leader election both talk to the API server with the same settings
(``kubernetes:`` in the config file), so they load credentials here, once written: the pod's
ServiceAccount when ``in_cluster``, else a kubeconfig file (``KUBECONFIG`` or ``~/.kube/config``
when none is named) and an optional context. A file that does not load is the user's
configuration to fix, so it raises :class:`~diagnoser.errors.ConfigError` with one line saying
what could not be loaded and why::

    credentials = load_credentials(settings.kubernetes)
    api = credentials.api_client()       # kubernetes.client.ApiClient, no automatic retries
    credentials.identity                 # "context prod of ~/.kube/config", for error messages

The ``kubernetes`` package is imported only when credentials are loaded: it is large, and only
needed when Kubernetes is configured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagnoser.config import KubernetesSettings
from diagnoser.errors import ConfigError

__all__ = ["Credentials", "load_credentials"]


@dataclass(frozen=True)
class Credentials:
    """A loaded client ``Configuration`` and who it authenticates as, in words."""

    #: A ``kubernetes.client.Configuration`` (host, token or client certificate, CA).
    configuration: Any
    #: Whose credentials these are, as a 401 message names them: "the pod's ServiceAccount".
    identity: str

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` over these credentials; the caller closes it."""
        from kubernetes import client as k8s_client

        return k8s_client.ApiClient(self.configuration)


def load_credentials(settings: KubernetesSettings, *, purpose: str = "kubernetes") -> Credentials:
    """Load in-cluster or kubeconfig credentials; :class:`ConfigError` naming ``purpose`` if they fail."""
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    configuration = k8s_client.Configuration()
    try:
        if settings.in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            identity = "the pod's ServiceAccount"
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                context=settings.context,
                client_configuration=configuration,
                persist_config=False,
            )
            where = str(settings.kubeconfig) if settings.kubeconfig else "the default kubeconfig"
            identity = f"context {settings.context} of {where}" if settings.context else where
    except Exception as exc:  # the loaders raise ConfigException, OSError, YAML and key errors alike
        what = "in-cluster configuration" if settings.in_cluster else "kubeconfig"
        detail = " ".join(str(exc).split())  # YAML errors span lines; a config error is one
        raise ConfigError(f"{purpose}: cannot load {what}: {detail}") from exc
    # urllib3 retries connection errors three times by default; one try per call, no more: a
    # read that failed is reported, and a Lease round that failed is tried at the next renewal.
    configuration.retries = False
    return Credentials(configuration=configuration, identity=identity)
