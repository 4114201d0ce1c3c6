"""The engine deployment's autoscaling policy: replicas for the tokens waiting in the engines'
queues. Ray Serve applies `min_replicas`/`max_replicas` and the up/down-scale delays around it."""

import math


class QueueDepthPolicy:
    """Enough replicas that each would have at most `target_queued_tokens` waiting, counting a
    replica's ongoing requests too so a busy replica with an empty queue is not scaled away:
    `max(ceil(queued / target), replicas with work)`. Its inputs are the replicas'
    `record_autoscaling_stats` (`queued_tokens`, `in_flight`), averaged over Ray's look-back
    window."""

    def __init__(self, target_queued_tokens: int):
        if target_queued_tokens <= 0:
            raise ValueError(f"target_queued_tokens must be positive, not {target_queued_tokens}")
        self.target = target_queued_tokens

    def __call__(self, ctx) -> tuple[int, dict]:
        metrics = ctx.aggregated_metrics or {}
        queued = sum(metrics.get("queued_tokens", {}).values())
        busy = sum(1 for v in metrics.get("in_flight", {}).values() if v > 0)
        return max(math.ceil(queued / self.target), busy), ctx.policy_state
