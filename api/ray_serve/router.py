"""The engine deployment's request router (Ray Serve's request-router API): a request goes to the
replica whose KV cache holds the longest prefix of its query, unless that replica is overloaded;
otherwise to the least-loaded replica. `api.ray_serve.routing` holds the policy."""

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from api.ray_serve.routing import Key, PrefixTable, Strategy, rank


class PrefixAffinityRouter(RequestRouter):
    """Ranks replicas by `routing.rank`: the deepest holder of the request's prefix (from the
    replicas' `record_routing_stats` reports and this router's own routing since), or under
    `strategy="hash"` the prefix's rendezvous-hash owner; `imbalance` ongoing requests past the
    least-loaded replica's count as overloaded; a holder of less than `min_match` of the key's
    blocks is no holder."""

    def initialize_state(
        self,
        strategy: Strategy = "prefix",
        imbalance: int = 8,
        min_match: float = 0.5,
        table_size: int = 65536,
    ) -> None:
        self.strategy = strategy
        self.imbalance = imbalance
        self.min_match = min_match
        self.table = PrefixTable(table_size)
        self._reports: dict[ReplicaID, dict] = {}  # the report last read, per replica

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # every replica is offered
        self._read_reports(candidate_replicas)
        by_id = {r.replica_id: r for r in candidate_replicas}
        key = _key(pending_request)
        ranks = rank(
            key,
            list(by_id),
            self._load,
            self.table,
            strategy=self.strategy,
            imbalance=self.imbalance,
            min_match=self.min_match,
        )
        if ranks:
            # recorded now: Ray tells `on_request_routed` only under strict max_ongoing_requests;
            # should the chosen replica refuse, the replicas' next reports correct the table
            self.table.routed(key, ranks[0][0])
        return [[by_id[i] for i in ids] for ids in ranks]

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.table.forget(replica_id)
        self._reports.pop(replica_id, None)

    def _load(self, replica_id: ReplicaID) -> int:
        # ongoing requests as last probed or sent from here; unknown counts as idle
        return self.replica_queue_len_cache.get(replica_id) or 0

    def _read_reports(self, replicas: list[RunningReplica]) -> None:
        for r in replicas:
            stats = r.routing_stats
            if stats and self._reports.get(r.replica_id) is not stats:
                self._reports[r.replica_id] = stats
                self.table.report(r.replica_id, stats.get("prefixes", ()))


def _key(pending_request: PendingRequest | None) -> Key:
    return tuple(pending_request.kwargs.get("prefix", ())) if pending_request else ()
