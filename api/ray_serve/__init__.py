"""Scale-out on Ray Serve: N engine replicas behind one ingress, with prefix-affinity routing,
health checks, graceful drain and queue-depth autoscaling (`pip install ".[ray]"`).

    serve run api.ray_serve:build_app replicas=2

See `api.ray_serve.deployment` for the options and docs/ray-serve.md.
"""

from api.ray_serve.deployment import RayOptions, build_app

__all__ = ["RayOptions", "build_app"]
