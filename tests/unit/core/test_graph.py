"""Graph algorithms over node names: back edges, the cycle a back edge closes, strongly connected parts."""

from __future__ import annotations

from streamlet.core.model.graph import back_edges, cycle_through, strongly_connected

DAG = {"s": ["a", "b"], "a": ["c"], "b": ["c"], "c": []}
SELF_LOOP = {"s": ["a"], "a": ["a", "b"], "b": []}
TWO_LOOPS = {"s": ["a", "c"], "a": ["b"], "b": ["a"], "c": ["d"], "d": ["e"], "e": ["c"]}
NESTED = {"s": ["a"], "a": ["b"], "b": ["c"], "c": ["b", "a"]}
UNREACHABLE = {"s": ["a"], "a": [], "x": ["y"], "y": ["x"], "z": []}


def parts(successors: dict[str, list[str]]) -> list[list[str]]:
    """strongly_connected as sorted lists, in a fixed order."""
    return sorted(sorted(part) for part in strongly_connected(successors))


def test_dag_has_no_back_edges() -> None:
    """A diamond without cycles has no back edge."""
    assert back_edges(["s"], DAG) == set()


def test_dag_has_no_strongly_connected_parts() -> None:
    """Single nodes without a self-loop are not reported."""
    assert strongly_connected(DAG) == []


def test_child_missing_from_mapping_is_a_leaf() -> None:
    """A node that only appears as a child has no successors."""
    assert back_edges(["s"], {"s": ["t"]}) == set()
    assert strongly_connected({"s": ["t"]}) == []


def test_self_loop_is_its_own_back_edge() -> None:
    """a -> a is a back edge."""
    assert back_edges(["s"], SELF_LOOP) == {("a", "a")}


def test_cycle_through_self_loop() -> None:
    """The cycle of a self-loop is [a, a]."""
    assert cycle_through(("a", "a"), SELF_LOOP) == ["a", "a"]


def test_self_loop_is_a_strongly_connected_part() -> None:
    """A single node with a self-loop is reported on its own."""
    assert strongly_connected(SELF_LOOP) == [{"a"}]


def test_two_separate_loops_have_one_back_edge_each() -> None:
    """a <-> b and c -> d -> e -> c are closed by b -> a and e -> c."""
    assert back_edges(["s"], TWO_LOOPS) == {("b", "a"), ("e", "c")}


def test_cycle_through_each_of_two_loops() -> None:
    """Each back edge names its own loop, starting and ending at its head."""
    assert cycle_through(("b", "a"), TWO_LOOPS) == ["a", "b", "a"]
    assert cycle_through(("e", "c"), TWO_LOOPS) == ["c", "d", "e", "c"]


def test_two_separate_loops_are_two_parts() -> None:
    """Two disjoint loops are two strongly connected parts; the root is in neither."""
    assert parts(TWO_LOOPS) == [["a", "b"], ["c", "d", "e"]]


def test_nested_loops_have_a_back_edge_per_loop() -> None:
    """Inner loop b -> c -> b and outer loop a -> b -> c -> a each get a back edge."""
    assert back_edges(["s"], NESTED) == {("c", "b"), ("c", "a")}


def test_cycle_through_nested_loops() -> None:
    """The inner back edge names the inner loop, the outer one the outer loop."""
    assert cycle_through(("c", "b"), NESTED) == ["b", "c", "b"]
    assert cycle_through(("c", "a"), NESTED) == ["a", "b", "c", "a"]


def test_nested_loops_are_one_part() -> None:
    """Loops sharing nodes form a single strongly connected part."""
    assert strongly_connected(NESTED) == [{"a", "b", "c"}]


def test_loop_unreachable_from_roots_still_has_a_back_edge() -> None:
    """Nodes no root reaches are searched too, in mapping order."""
    assert back_edges(["s"], UNREACHABLE) == {("y", "x")}


def test_loop_unreachable_from_roots_is_a_part() -> None:
    """strongly_connected covers every node of the mapping, not only reachable ones."""
    assert strongly_connected(UNREACHABLE) == [{"x", "y"}]


def test_roots_decide_which_edge_of_a_loop_is_the_back_edge() -> None:
    """Searching a <-> b from a closes it with b -> a; from b, with a -> b."""
    loop = {"a": ["b"], "b": ["a"]}
    assert back_edges(["a"], loop) == {("b", "a")}
    assert back_edges(["b"], loop) == {("a", "b")}


def test_cycle_through_takes_a_shortest_path() -> None:
    """With two ways from the head back to the tail, the cycle uses the shorter one."""
    successors = {"a": ["c", "b"], "c": ["e"], "e": ["d"], "b": ["d"], "d": ["a"]}
    assert cycle_through(("d", "a"), successors) == ["a", "b", "d", "a"]


def test_long_chain_has_no_back_edges() -> None:
    """back_edges handles a 5000-node chain (no recursion limit)."""
    chain = {f"n{i}": [f"n{i + 1}"] for i in range(5000)}
    assert back_edges(["n0"], chain) == set()


def test_long_chain_has_no_strongly_connected_parts() -> None:
    """strongly_connected handles a 5000-node chain like back_edges does."""
    chain = {f"n{i}": [f"n{i + 1}"] for i in range(5000)}
    assert strongly_connected(chain) == []
