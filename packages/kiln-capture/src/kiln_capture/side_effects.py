"""Side effects of the captured region, replayed after the graph in program order:
mutated input lists and dicts (their final contents), attribute stores, item stores on
records passed in, global stores,
and calls of real objects the graph cannot make (exiting an autocast entered outside)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln_capture.variables.base import Var


@dataclass
class SideEffects:
    mutated_containers: list[Var] = field(default_factory=list)
    attr_stores: dict[tuple[int, str], tuple[Var, str, Var]] = field(default_factory=dict)
    # stores made through object.__setattr__ (a frozen dataclass's __init__): replayed so
    raw_stores: set[tuple[int, str]] = field(default_factory=set)
    global_stores: dict[str, Var] = field(default_factory=dict)
    item_stores: list[tuple[Var, object, object, Var]] = field(default_factory=list)
    order: list[tuple[str, object]] = field(default_factory=list)
    # forward (pre-)hooks registered in the trace, per module id: (table, hook, with_kwargs);
    # the module's later calls in the trace run them, the registration is replayed
    module_hooks: dict[int, list[tuple[str, Var, bool]]] = field(default_factory=dict)
    # bumped by every change: a reused call (call_reuse.py) needs none since its recording
    version: int = 0
    # told when a read returns what the trace stored (call_reuse.py's recorders)
    listeners: list = field(default_factory=list)

    def mutated(self, container: Var) -> None:
        if container.source is None:
            return  # created inside the trace: rebuilt when it escapes
        self.version += 1
        if all(c is not container for c in self.mutated_containers):
            self.mutated_containers.append(container)
            self.order.append(("container", container))

    def store_attr(self, obj: Var, name: str, value: Var, raw: bool = False) -> None:
        self.version += 1
        key = (id(obj), name)
        if key not in self.attr_stores:
            self.order.append(("attr", key))
        self.attr_stores[key] = (obj, name, value)
        if raw:
            self.raw_stores.add(key)

    def store_item(self, obj: Var, method: object, key: object, value: Var) -> None:
        """``method(obj, key, value)``: a dict's C ``__setitem__`` on an object passed in
        (a ModelOutput's ``super().__setitem__``), replayed with the same method."""
        self.version += 1
        self.item_stores.append((obj, method, key, value))
        self.order.append(("item", len(self.item_stores) - 1))

    def pending_attr(self, obj: Var, name: str) -> Var | None:
        entry = self.attr_stores.get((id(obj), name))
        if entry is None:
            return None
        for listener in self.listeners:  # a replay would read the real attribute
            listener.fail(f"reads attribute {name}, which the trace set")
        return entry[2]

    def store_global(self, name: str, value: Var) -> None:
        self.version += 1
        if name not in self.global_stores:
            self.order.append(("global", name))
        self.global_stores[name] = value

    def call_after(self, statement) -> None:
        """A statement over the frame's sources, run after the graph (no value computed);
        a callable ``statement(cg)`` is asked for the text at replay time."""
        self.version += 1
        self.order.append(("call", statement))

    def values(self) -> list[Var]:
        out: list[Var] = []
        for kind, key in self.order:
            if kind == "container":
                out.extend(key.children())
            elif kind == "attr":
                out.append(self.attr_stores[key][2])
            elif kind == "global":
                out.append(self.global_stores[key])
            elif kind == "item":
                out.append(self.item_stores[key][3])
        return out

    def replay(self, cg) -> tuple[list[str], list[str]]:
        """Python statements for the effects: first every new value is computed (sources
        denote the state before the frame ran, so they are all read before any write),
        then the writes are applied in program order."""
        from kiln_capture.variables.containers import DictVar, rebuild_key

        compute: list[str] = []
        apply: list[str] = []
        for i, (kind, key) in enumerate(self.order):
            tmp = f"__k_e{i}"
            if kind == "container":
                src = key.source.expr()
                write_back = getattr(key, "write_back", None)  # a deque's clear + extend
                if write_back is not None:
                    c, a = write_back(cg, src, tmp)
                    compute.append(c)
                    apply.append(a)
                elif isinstance(key, DictVar):
                    body = ", ".join(
                        f"{rebuild_key(cg, k)}: {cg.rebuild(v)}" for k, v in key.items.items()
                    )
                    compute.append(f"{tmp} = {{{body}}}")
                    apply.append(f"__k_d = {src}; __k_d.clear(); __k_d.update({tmp})")
                else:
                    compute.append(f"{tmp} = [{', '.join(cg.rebuild(i) for i in key.items)}]")
                    apply.append(f"{src}[:] = {tmp}")
            elif kind == "attr":
                obj, name, value = self.attr_stores[key]
                compute.append(f"{tmp} = ({cg.rebuild(obj)}, {cg.rebuild(value)})")
                store = "object.__setattr__" if key in self.raw_stores else "setattr"
                apply.append(f"{store}({tmp}[0], {name!r}, {tmp}[1])")
            elif kind == "call":
                apply.append(key(cg) if callable(key) else key)
            elif kind == "item":
                obj, method, k, value = self.item_stores[key]
                compute.append(f"{tmp} = ({cg.rebuild(obj)}, {cg.rebuild(value)})")
                apply.append(f"{cg.const(method)}({tmp}[0], {cg.const(k)}, {tmp}[1])")
            else:
                compute.append(f"{tmp} = {cg.rebuild(self.global_stores[key])}")
                apply.append(f"__k_G[{key!r}] = {tmp}")
        return compute, apply

    def __bool__(self) -> bool:
        return bool(self.order)
