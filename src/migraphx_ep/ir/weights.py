"""What the compiles of one subgraph share about its weights, so a new input shape redoes none of it.

A fused subgraph (``ep/compiled.py``) compiles a program per input-shape key, each from the same
initializers. Whatever is computed from weights alone is the same for every shape, so its owner keeps
one ``WeightCache`` and hands it to each compile (``parse_graph(..., weights=)``, ``Program.weights``):

* ``literal(array)``: one ``Literal`` per initializer array, so the content hash CSE compares weights
  by is computed once per subgraph, not once per shape;
* ``derive(what, sources, make)``: a literal computed from weight literals only (a folded constant in
  ``propagate_constant``, a weight converted by ``quantize_fp16``), and ``derive_array`` for host-side
  arrays (the gpu lowering's filter layouts). Keyed by the expression (``what`` and the keys of its
  sources), never by a value's bytes;
* ``shared(key, make)``: state a target keeps for all the programs (the gpu target's device copies).

Keys name weights by ``id``: an initializer's literal is held for the cache's lifetime, and a derived
value's key is dropped (weakref callback) as it dies, so an id is never reused while a key names it.
Expressions are interned to ints that are never reused either, so forgetting the (bounded) table of
them costs a recompute, never a wrong value. Derived values are held weakly here and strongly by the
programs whose compiles took them (``begin``): they live as long as one of those programs does (also
when a later pass dropped the literal itself, e.g. folding a broadcast into a view of its memory), and
the cache never keeps more than the live programs do. Used by one compile at a time (the subgraph
compiles under its lock).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

from .operation import Literal

T = TypeVar("T")

# Interned expressions kept (each new input shape adds its shape-dependent ones, e.g. a weight broadcast
# to its batch size): beyond this the table starts afresh rather than grow with every shape ever seen.
MAX_EXPRESSIONS = 1 << 14


class WeightCache:
    def __init__(self) -> None:
        self._initializers: dict[int, tuple[Any, Literal]] = {}  # id(initializer) -> (it, its literal)
        self._keys: dict[int, int] = {}  # id(literal or array) -> its expression key
        self._exprs: dict[Hashable, int] = {}  # (what, source keys) -> expression key (hash-consing)
        self._numbers = itertools.count()  # expression keys: never reused, even after a reset
        self._values: weakref.WeakValueDictionary[tuple[str, int], Any] = weakref.WeakValueDictionary()
        self._shared: dict[Hashable, Any] = {}
        self._held: list[Any] | None = None  # what the current compile took: its program holds it
        self.hits = 0  # derived values found (tests and the compile log read these)
        self.misses = 0

    # -- initializers ---------------------------------------------------------------------------------
    def literal(self, source: Any, make: Callable[[Any], np.ndarray] = np.asarray) -> Literal:
        """The literal of the initializer ``source`` (its value is ``make(source)``): the same object
        for every compile that reads that initializer."""
        found = self._initializers.get(id(source))
        if found is not None and found[0] is source:
            return found[1]
        lit = Literal(make(source))
        self._initializers[id(source)] = (source, lit)  # holding ``source`` keeps its id ours
        self._keys[id(lit)] = self._intern(("initializer", len(self._initializers)))
        return lit

    # -- derived values -------------------------------------------------------------------------------
    def begin(self) -> list[Any]:
        """A new compile (``parse_graph`` calls this): the derived values it takes or makes from now on
        are added to the list returned, which its program keeps (``Program.derived_weights``)."""
        self._held = []
        return self._held

    def key_of(self, lit: Literal) -> int | None:
        """The expression key of a weight literal (an initializer's, or one this cache derived)."""
        return self._keys.get(id(lit))

    def expression(self, what: Hashable, sources: Sequence[int | None]) -> int | None:
        """The key of ``what`` applied to the weights keyed ``sources`` (None if any is not a weight,
        or ``what`` cannot be hashed: such a value is computed every time)."""
        if any(s is None for s in sources):
            return None
        try:
            return self._intern((what, tuple(sources)))
        except TypeError:  # an op attribute without a hash
            return None

    def derive(self, what: Hashable, sources: Sequence[Literal], make: Callable[[], np.ndarray]) -> Literal:
        """``make()``, computed from the weight literals ``sources`` alone, as a literal: one object
        while anything holds it. With a source that is not a weight, just ``Literal(make())``."""
        key = self.expression(what, [self.key_of(s) for s in sources])
        return self.derived(key, make)  # type: ignore[return-value]  # make never gives None here

    def derived(self, key: int | None, make: Callable[[], np.ndarray | None]) -> Literal | None:
        """The literal of expression ``key`` (``expression``), computed by ``make`` when not held
        (None when ``make`` gives None: nothing is remembered)."""
        lit = self._values.get(("literal", key)) if key is not None else None
        if lit is not None:
            self.hits += 1
            return self._hold(lit)
        value = make()
        if value is None:
            return None
        lit = Literal(value)
        if key is not None:
            self.misses += 1
            self._remember("literal", key, lit)
        return self._hold(lit)

    def derive_array(self, what: Hashable, source: Literal, make: Callable[[], np.ndarray]) -> np.ndarray:
        """A host array computed from one weight literal (a layout transform): one array while held."""
        key = self.expression(what, [self.key_of(source)])
        if key is None:
            return make()
        arr = self._values.get(("array", key))
        if arr is not None:
            self.hits += 1
            return self._hold(arr)
        self.misses += 1
        arr = make()
        arr.setflags(write=False)  # shared by programs (and their device copies): never edited
        self._remember("array", key, arr)
        return self._hold(arr)

    def _hold(self, value: T) -> T:
        if self._held is not None:
            self._held.append(value)
        return value

    def _remember(self, kind: str, key: int, value: Any) -> None:
        self._values[(kind, key)] = value
        self._keys[id(value)] = key
        # Forget the id as the value dies, before the interpreter can give it to a new object.
        weakref.finalize(value, self._keys.pop, id(value), None).atexit = False

    def _intern(self, expr: Hashable) -> int:
        key = self._exprs.get(expr)
        if key is None:
            if len(self._exprs) >= MAX_EXPRESSIONS:
                self._exprs.clear()
            key = self._exprs[expr] = next(self._numbers)
        return key

    # -- target state ----------------------------------------------------------------------------------
    def shared(self, key: Hashable, make: Callable[[], T]) -> T:
        """State a target keeps across this subgraph's programs (made on first use)."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]


def op_key(op: Any, shape: Any) -> Hashable:
    """An instruction's op and result shape as part of an expression key. ``repr`` guards against
    attributes that compare equal but mean different things (0.0 and -0.0, 1 and True)."""
    return (type(op), op, repr(op), shape)


__all__ = ["WeightCache", "op_key"]
