"""Graph algorithms over node names: back edges and strongly connected parts."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping


def back_edges(roots: Iterable[str], successors: Mapping[str, list[str]]) -> set[tuple[str, str]]:
    """Edges ``(u, v)`` that close a cycle in a depth-first search from ``roots``.

    Nodes not reachable from a root are searched too, in mapping order, so
    every cycle has at least one back edge.
    """
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    found: set[tuple[str, str]] = set()
    for root in [*roots, *successors]:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(successors.get(root, ())))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                found.add((node, child))
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(successors.get(child, ()))))
    return found


def cycle_through(edge: tuple[str, str], successors: Mapping[str, list[str]]) -> list[str]:
    """Node names of one cycle closed by back ``edge`` ``(u, v)``: ``[v, ..., u, v]``."""
    start, end = edge[1], edge[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier and end not in parents and end != start:
        next_frontier = []
        for node in frontier:
            for child in successors.get(node, ()):
                if child not in parents and child != start:
                    parents[child] = node
                    next_frontier.append(child)
        frontier = next_frontier
    path = [end]
    while path[-1] != start:
        path.append(parents[path[-1]])
    return [*reversed(path), start]


def strongly_connected(successors: Mapping[str, list[str]]) -> list[set[str]]:
    """Strongly connected components with a cycle (size > 1 or a self-loop).

    Tarjan's algorithm with an explicit stack, so a topology of any length
    does not hit Python's recursion limit.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []

    def enter(node: str) -> tuple[str, Iterator[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return node, iter(successors.get(node, ()))

    for root in successors:
        if root in index:
            continue
        work = [enter(root)]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    work.append(enter(child))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                part = _pop_component(stack, on_stack, node)
                if len(part) > 1 or node in successors.get(node, ()):
                    found.append(part)
    return found


def _pop_component(stack: list[str], on_stack: set[str], root: str) -> set[str]:
    part = set()
    while True:
        member = stack.pop()
        on_stack.discard(member)
        part.add(member)
        if member == root:
            return part
