"""The Ray Serve application: an ingress deployment in front of N engine replicas.

    serve run api.ray_serve:build_app replicas=2
    serve run api.ray_serve:build_app min_replicas=1 max_replicas=4 router=hash

Every replica runs one engine configured by the `SCORING_*` variables of the process that builds
the application (they travel in the replicas' runtime environment). `RayOptions` are the
deployment's own knobs, given as the builder's arguments (`key=value` to `serve run`, `args:` in
a Serve config file or a KubeRay RayService).
"""

import os
from typing import Literal

import msgspec
from ray import serve
from ray.serve.config import AutoscalingConfig, RequestRouterConfig

from api.ray_serve.autoscaling import QueueDepthPolicy
from api.ray_serve.ingress import Ingress
from api.ray_serve.replica import EngineReplica
from api.ray_serve.router import PrefixAffinityRouter
from api.settings import PREFIX, settings_from_env


class RayOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the application is deployed (every field is a builder argument of the same name)."""

    replicas: int = 2  # engine replicas, when not autoscaling
    # autoscaling on queue depth, between these (max_replicas set turns it on)
    min_replicas: int = 1
    max_replicas: int | None = None
    # tokens waiting per replica the autoscaler aims at; None: 4 batches (4 * token_budget)
    target_queued_tokens: int | None = None
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 120.0
    look_back_period_s: float = 30.0  # the window the replicas' queue figures are averaged over
    # "prefix": to the replica holding the longest prefix of the query (replicas report what
    # they hold); "hash": rendezvous hashing of the query; "default": Ray's power of two choices
    router: Literal["prefix", "hash", "default"] = "prefix"
    imbalance: int = 8  # ongoing requests past the least-loaded replica that count as overloaded
    # the share of a query's prefix blocks a replica must hold to be preferred ("prefix" router)
    min_match: float = 0.5
    routing_stats_period_s: float = 1.0  # how often replicas report their cached prefixes
    summary_size: int | None = None  # prefix hashes a replica reports; None: its KV pool's size
    max_ongoing_requests: int = 256  # requests one replica takes at once (its engine batches them)
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    ingress_replicas: int = 1
    retries: int = 2  # further replicas a request is sent to when its replica is lost
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    graceful_shutdown_timeout_s: float = 120.0  # a replica being removed finishes its requests


def build_app(args: dict | None = None) -> serve.Application:
    """The application for `serve run` / `serve.run`; `args` are `RayOptions` fields (strings
    from a command line are converted). ValueError names a wrong argument or `SCORING_*`
    variable."""
    try:
        options = msgspec.convert(args or {}, RayOptions, strict=False)
    except msgspec.ValidationError as e:
        raise ValueError(f"invalid Ray Serve option: {e}") from None
    settings = settings_from_env()  # checked here, before any replica starts
    env = {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}
    engine = serve.deployment(EngineReplica).options(
        name="EngineReplica",
        ray_actor_options={
            "num_cpus": options.replica_cpus,
            "num_gpus": options.replica_gpus,
            "runtime_env": {"env_vars": env},
        },
        max_ongoing_requests=options.max_ongoing_requests,
        health_check_period_s=options.health_check_period_s,
        health_check_timeout_s=options.health_check_timeout_s,
        graceful_shutdown_timeout_s=options.graceful_shutdown_timeout_s,
        **_scaling(options, settings.engine.token_budget),
        **_routing(options),
    )
    most = options.max_replicas or options.replicas  # engine replicas at most
    ingress = serve.deployment(Ingress).options(
        name="Ingress",
        num_replicas=options.ingress_replicas,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=options.max_ongoing_requests * most,
        graceful_shutdown_timeout_s=options.graceful_shutdown_timeout_s,
    )
    return ingress.bind(
        engine.bind(options.summary_size), settings.server.max_body_bytes, options.retries
    )


def _scaling(options: RayOptions, token_budget: int) -> dict:
    if options.max_replicas is None:
        return {"num_replicas": options.replicas}
    target = options.target_queued_tokens or 4 * token_budget
    policy = {
        "policy_function": f"{QueueDepthPolicy.__module__}:{QueueDepthPolicy.__name__}",
        "policy_kwargs": {"target_queued_tokens": target},
    }
    config = AutoscalingConfig(
        min_replicas=options.min_replicas,
        max_replicas=options.max_replicas,
        upscale_delay_s=options.upscale_delay_s,
        downscale_delay_s=options.downscale_delay_s,
        look_back_period_s=options.look_back_period_s,
        # Ray wants a few figures per look-back window (a shorter window than its default
        # interval is refused by newer releases)
        metrics_interval_s=min(10.0, options.look_back_period_s / 2),
        policy=policy,
    )
    return {"autoscaling_config": config}


def _routing(options: RayOptions) -> dict:
    if options.router == "default":
        return {}
    config = RequestRouterConfig(
        request_router_class=PrefixAffinityRouter,
        request_router_kwargs={
            "strategy": options.router,
            "imbalance": options.imbalance,
            "min_match": options.min_match,
        },
        request_routing_stats_period_s=options.routing_stats_period_s,
    )
    return {"request_router_config": config}
