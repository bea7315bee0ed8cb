"""Maximum flow / minimum cut on a small directed graph (Dinic's algorithm).

Capacities are integers; ``INF`` marks an edge that can never be cut. ``min_cut`` returns
the source side of a minimum s-t cut: the nodes reachable from the source in the residual
graph of a maximum flow.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

INF = 1 << 62


class FlowNetwork:
    def __init__(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._names: list[Hashable] = []
        self._adj: list[list[int]] = []
        # edge arrays: head node, residual capacity; edge e ^ 1 is its reverse
        self._to: list[int] = []
        self._cap: list[int] = []

    def node(self, name: Hashable) -> int:
        i = self._index.get(name)
        if i is None:
            i = self._index[name] = len(self._names)
            self._names.append(name)
            self._adj.append([])
        return i

    def add_edge(self, u: Hashable, v: Hashable, capacity: int) -> None:
        a, b = self.node(u), self.node(v)
        self._adj[a].append(len(self._to))
        self._to.append(b)
        self._cap.append(capacity)
        self._adj[b].append(len(self._to))
        self._to.append(a)
        self._cap.append(0)

    def _levels(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self._names)
        level[s] = 0
        q = deque([s])
        while q:
            u = q.popleft()
            for e in self._adj[u]:
                v = self._to[e]
                if self._cap[e] > 0 and level[v] < 0:
                    level[v] = level[u] + 1
                    q.append(v)
        return level if level[t] >= 0 else None

    def _augment(self, s: int, t: int, level: list[int], it: list[int]) -> int:
        """One blocking-flow path found iteratively (no recursion limit on deep graphs)."""
        path: list[int] = []
        u = s
        while True:
            if u == t:
                flow = min(self._cap[e] for e in path)
                for e in path:
                    self._cap[e] -= flow
                    self._cap[e ^ 1] += flow
                return flow
            advanced = False
            while it[u] < len(self._adj[u]):
                e = self._adj[u][it[u]]
                v = self._to[e]
                if self._cap[e] > 0 and level[v] == level[u] + 1:
                    path.append(e)
                    u = v
                    advanced = True
                    break
                it[u] += 1
            if not advanced:
                if not path:
                    return 0
                level[u] = -1  # dead end: prune it
                e = path.pop()
                u = self._to[e ^ 1]
                it[u] += 1

    def max_flow(self, source: Hashable, sink: Hashable) -> int:
        s, t = self.node(source), self.node(sink)
        total = 0
        while (level := self._levels(s, t)) is not None:
            it = [0] * len(self._names)
            while (f := self._augment(s, t, level, it)) > 0:
                total += f
                if total >= INF:
                    return total
        return total

    def min_cut(self, source: Hashable, sink: Hashable) -> tuple[int, set[Hashable]]:
        """(cut value, names on the source side)."""
        value = self.max_flow(source, sink)
        s = self.node(source)
        seen = {s}
        q = deque([s])
        while q:
            u = q.popleft()
            for e in self._adj[u]:
                v = self._to[e]
                if self._cap[e] > 0 and v not in seen:
                    seen.add(v)
                    q.append(v)
        return value, {self._names[i] for i in seen}
