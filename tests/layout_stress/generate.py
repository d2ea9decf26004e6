#!/usr/bin/env python3
"""Writes one translation unit of zest's layout stress test (tests/layout_stress/README.md).

    python3 generate.py --file 2 --output layout_stress_2.cpp [--seed 1000] [--min-types 210]

Why: g++ 12 miscompiled translation units that hold many tensor types with different
layouts (class-type template arguments): duplicate symbols at assembly, internal compiler
errors, and layouts that read differently at run time than at compile time, depending on
what else the file contained (issue 10). So each file instantiates a few hundred distinct
tensor types, redistributes and einsums between them, in an order and mix of its own, and
checks at run time that every type's layout, layout string, blocks and values are right
(the checks are in stress_support.hpp). The output depends only on --file, --seed and
--min-types (and Python's random module, stable across Python 3 versions for the calls
used here): the same arguments give the same bytes.

What one file covers:
  - meshes of 1, 2, 3 and 4 axes, axis names of 1 to 5 characters, with repeated letters
    ("pp", "xx") and single letters; each file's meshes are listed in PROFILES below, and
    every file has the reproducer's mesh<"x", "y", "z">;
  - every placement: replicate (implicit, and sometimes spelled replicate<"a">), split,
    split nested over 2 to 4 axes in a random nesting order, partial; the placements of a
    layout<...> in random order (two spellings of one layout are one type);
  - element types float, double, zest::bfloat16, zest::float16 and std::int32_t (einsums:
    float, double, bfloat16: what the host contraction takes);
  - dims strings of 1 to 5 letters, upper and lower case; uneven extents (7, 5, 13, 3 over
    2 or 4 ranks, extents smaller than the number of ranks);
  - chains of 1 to 4 redistribute<layout<...>>(t) (some from an rvalue), inputs made by
    X::generate, X::from_global, or from genuine partial summands;
  - einsums with a forced output layout (partial ones too) and with a deduced one:
    contractions of two operands ("ab,bc->ca"), reductions of one ("Jg->g"), transposes;
    some results redistributed again;
  - the reproducer itself (tests/layout_stress/bug_repro.cpp) as one scenario, first, in
    the middle or last depending on the file.

The generator computes each layout's normalised form and the string zest's to_string
prints for it itself (expected_string below), and writes both the string and a
static_assert that zest::parse_layout of it equals X::layout; the program then compares
what X::layout and layout_string<X>() give at run time.

Mesh shapes: each mesh runs with every shape of its list that fits the number of ranks:
one axis takes all ranks (-1), and, for meshes of two or more axes, one axis of size 2
with another taking the rest (only with 2 or 4 ranks). So every program runs at np 1, 2, 4.
"""

import argparse
import random

# C++ spelling of each element type; the einsum ones are those host::contract accepts.
ELEMENT_TYPES = {
    "float": "float",
    "double": "double",
    "bf16": "zest::bfloat16",
    "f16": "zest::float16",
    "i32": "std::int32_t",
}
EINSUM_TYPES = ("float", "double", "bf16")

# Extents to draw from: mostly uneven over 2 and 4 ranks, some smaller than 4.
EXTENTS = (7, 5, 13, 3, 6, 2, 9, 4, 1, 11, 8)
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
BUG_MESH = ("x", "y", "z")

# One profile per file: its meshes, how often each element type and scenario kind comes,
# how often an axis splits / holds a partial sum, and the order its scenarios are written
# in. Different files mix types in different orders on purpose: the g++ bug depended on
# what else a file contained.
PROFILES = [
    dict(  # 0: the reproducer first, float-heavy, reductions early
        meshes=[BUG_MESH, ("pp",), ("dp", "tp"), ("a", "bb", "ccc", "dddd")],
        types={"float": 5, "bf16": 2, "double": 2, "f16": 1, "i32": 1},
        kinds={"chain": 4, "unary": 3, "binary": 2},
        split=0.45, partial=0.2, order="interleave", bug_at="first"),
    dict(  # 1: bf16 first, 4-axis meshes, deep nesting
        meshes=[("xx", "y", "pp", "model"), ("q", "r", "s", "t"), BUG_MESH, ("ep", "xx"), ("data",)],
        types={"bf16": 5, "float": 2, "double": 1, "f16": 1, "i32": 1},
        kinds={"chain": 4, "unary": 2, "binary": 2},
        split=0.6, partial=0.15, order="by_type", bug_at="last"),
    dict(  # 2: double, 1- and 2-axis meshes, long dims, einsum-heavy
        meshes=[("w",), ("ep", "sp"), ("zz", "z"), BUG_MESH, ("pipe", "p", "pp", "ppp")],
        types={"double": 5, "float": 2, "bf16": 2, "f16": 1, "i32": 1},
        kinds={"chain": 3, "unary": 2, "binary": 4},
        split=0.5, partial=0.2, order="einsum_first", bug_at="middle"),
    dict(  # 3: a uniform mix, written by mesh, most axes first
        meshes=[BUG_MESH, ("mm", "m"), ("abc", "b", "xx"), ("u", "v", "ww", "xyz"), ("tp",)],
        types={"float": 1, "double": 1, "bf16": 1, "f16": 1, "i32": 1},
        kinds={"chain": 1, "unary": 1, "binary": 1},
        split=0.5, partial=0.25, order="by_mesh", bug_at="middle"),
    dict(  # 4: partial-heavy, reductions and forced partial outputs, written in reverse
        meshes=[("x",), BUG_MESH, ("tp", "dp", "ep"), ("pp", "q"), ("aa", "a", "aaa", "b")],
        types={"float": 3, "bf16": 3, "double": 1, "f16": 1, "i32": 1},
        kinds={"chain": 3, "unary": 3, "binary": 2},
        split=0.35, partial=0.4, order="reverse", bug_at="first"),
    dict(  # 5: mostly 3-axis meshes, interleaved
        meshes=[BUG_MESH, ("xx", "yy", "zz"), ("k", "kk", "kkk"), ("r",), ("s", "ss"), ("e", "f", "g", "h")],
        types={"float": 2, "double": 2, "bf16": 2, "f16": 1, "i32": 1},
        kinds={"chain": 3, "unary": 2, "binary": 2},
        split=0.5, partial=0.25, order="interleave", bug_at="last"),
]

# ---------------------------------------------------------------------------------------
# Layouts. A normalised layout is a tuple with one entry per mesh axis: ("r",) replicate,
# ("p",) partial, ("s", dim, order) split of dim, order = position in dim's nesting.


def random_layout(rng, naxes, dims, p_split, p_partial, no_partial=()):
    """A valid layout: each axis replicates, splits a dim of `dims`, or is partial (not on
    the axes in no_partial). Dims split by several axes get a random nesting order."""
    kinds = []
    for a in range(naxes):
        x = rng.random()
        if x < p_split:
            kinds.append(("s", rng.choice(dims)))
        elif x < p_split + p_partial and a not in no_partial:
            kinds.append(("p",))
        else:
            kinds.append(("r",))
    out = [None] * naxes
    for d in dims:
        axes = [a for a, k in enumerate(kinds) if k[0] == "s" and k[1] == d]
        rng.shuffle(axes)
        for order, a in enumerate(axes):
            out[a] = ("s", d, order)
    for a, k in enumerate(kinds):
        if k[0] != "s":
            out[a] = k
    return tuple(out)


def split_axes(layout, dim):
    """The axes that split dim, in nesting order."""
    found = [(e[2], a) for a, e in enumerate(layout) if e[0] == "s" and e[1] == dim]
    return [a for _, a in sorted(found)]


def expected_string(layout, names):
    """What zest::to_string prints: placements in mesh-axis order (a nested split at its
    major axis), "replicate" when there are none."""
    parts = []
    for a, e in enumerate(layout):
        if e[0] == "p":
            parts.append("partial(%s)" % names[a])
        elif e[0] == "s" and e[2] == 0:
            parts.append("split(%s:%s)" % (e[1], ",".join(names[b] for b in split_axes(layout, e[1]))))
    return " ".join(parts) if parts else "replicate"


def layout_code(layout):
    """The normalised layout as stress::decode() reads it: "sg0 r p" (split g order 0,
    replicate, partial)."""
    return " ".join("s%s%d" % (e[1], e[2]) if e[0] == "s" else e[0] for e in layout)


def spell_layout(rng, layout, names):
    """A zest::layout<...> spelling of the layout: placements in random order, some
    replicated axes named with replicate<"a">."""
    placements = []
    seen = set()
    for a, e in enumerate(layout):
        if e[0] == "p":
            placements.append('zest::partial<"%s">' % names[a])
        elif e[0] == "r" and rng.random() < 0.2:
            placements.append('zest::replicate<"%s">' % names[a])
        elif e[0] == "s" and e[1] not in seen:
            seen.add(e[1])
            axes = ", ".join('"%s"' % names[b] for b in split_axes(layout, e[1]))
            placements.append("zest::split<'%s', %s>" % (e[1], axes))
    rng.shuffle(placements)
    return "zest::layout<%s>" % ", ".join(placements)


def partial_axes(layout):
    return {a for a, e in enumerate(layout) if e[0] == "p"}


# ---------------------------------------------------------------------------------------
# Scenarios: each is one C++ function over one mesh type.


class Mesh:
    def __init__(self, index, names, rng):
        self.index = index
        self.names = names
        self.alias = "M%d" % index
        self.spelling = "zest::mesh<%s>" % ", ".join('"%s"' % n for n in names)
        n = len(names)
        if names == BUG_MESH:
            free = 2  # bug.cpp's {1, 1, -1}
        else:
            free = rng.randrange(n)
        self.shapes = [[-1 if a == free else 1 for a in range(n)]]
        if n >= 2:
            two = rng.choice([a for a in range(n) if a != free])
            self.shapes.append([-1 if a == free else 2 if a == two else 1 for a in range(n)])


class FileWriter:
    def __init__(self, index, seed, min_types):
        self.index = index
        self.rng = random.Random(seed * 1000 + index)
        self.profile = PROFILES[index % len(PROFILES)]
        self.min_types = min_types
        self.meshes = [Mesh(i, names, self.rng) for i, names in enumerate(self.profile["meshes"])]
        self.types = set()  # (element, mesh, dims, layout): distinct tensor types
        self.plans = set()  # (from layout, to layout): distinct transition plans
        self.einsums = 0
        self.scenarios = []  # dicts: kind, mesh, element, comment, body (C++ lines), serial
        self.count = 0  # names t<N>, X<N>, L<N>, i<N> within a scenario
        self.features = set()  # what the scenarios so far cover (REQUIRED)
        # The dims strings of the tensors: a dozen per file, drawn from 9 letters (upper and
        # lower case), so that the types of a file differ mostly in their layouts (what the
        # bug was about) while zest's code that depends only on element type, mesh and dims
        # is instantiated less often (which keeps a file's compile time down).
        alphabet = self.new_dims(9)
        self.dims_pool = ["".join(self.rng.sample(alphabet, n)) for n in (1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 5)]
        # The first chains take each element type and each pooled dims string once, so that
        # a file covers them all whatever its weights; later ones draw by the weights.
        self.first_elements = sorted(ELEMENT_TYPES)
        self.rng.shuffle(self.first_elements)
        self.first_dims = self.dims_pool[:]
        self.rng.shuffle(self.first_dims)

    # --- what a file covers (checked by build(): every file must cover all of it)

    REQUIRED = {"mesh axes 1", "mesh axes 2", "mesh axes 3", "mesh axes 4", "replicate",
                "replicate spelled", "split", "nested split", "nested split over 3 axes",
                "partial", "two partial axes", "upper-case dim", "lower-case dim",
                "uneven extent", "extent below 4", "dims 1", "dims 4", "dims 5",
                "redistribute", "redistribute from an rvalue", "same layout respelled",
                "einsum contraction", "einsum reduction", "einsum forced partial output",
                "einsum deduced output", "input from_global", "input summands"}
    REQUIRED |= {"element " + e for e in ELEMENT_TYPES}

    def note_features(self, mesh, element, dims, layout):
        f = self.features
        f.add("mesh axes %d" % len(mesh.names))
        f.add("element " + element)
        f.add("dims %d" % len(dims))
        f.update("upper-case dim" if c.isupper() else "lower-case dim" for c in dims)
        kinds = [e[0] for e in layout]
        f.update({"r": "replicate", "s": "split", "p": "partial"}[k] for k in kinds)
        if kinds.count("p") >= 2:
            f.add("two partial axes")
        for d in dims:
            n = len(split_axes(layout, d))
            if n >= 2:
                f.add("nested split")
            if n >= 3:
                f.add("nested split over 3 axes")

    # --- pieces of scenario bodies

    def pick(self, weights):
        keys = sorted(weights)
        return self.rng.choices(keys, [weights[k] for k in keys])[0]

    def new_dims(self, n):
        return "".join(self.rng.sample(LETTERS, n))

    def extents(self, n, limit):
        while True:
            e = [self.rng.choice(EXTENTS) for _ in range(n)]
            total = 1
            for x in e:
                total *= x
            if total <= limit:
                self.note_extents(e)
                return e

    def note_extents(self, extents):
        if any(x % 2 for x in extents):
            self.features.add("uneven extent")
        if any(x < 4 for x in extents):
            self.features.add("extent below 4")

    def declare(self, body, mesh, element, dims, layout, deduced_from=None):
        """Declares L<k>, X<k> and i<k> (the type_info) for a tensor type; returns k."""
        k = self.count
        self.count += 1
        ctype = ELEMENT_TYPES[element]
        if deduced_from is not None:
            body.append("  using X%d = decltype(%s);" % (k, deduced_from))
            body.append('  static constexpr stress::type_info i%d{R"~(X%d = decltype(%s) on %s)~", nullptr, nullptr, X%d::layout};'
                        % (k, k, deduced_from, mesh.spelling, k))
            return k
        self.types.add((element, mesh.index, dims, layout))
        self.note_features(mesh, element, dims, layout)
        spelling = spell_layout(self.rng, layout, mesh.names)
        if "zest::replicate<" in spelling:
            self.features.add("replicate spelled")
        expected = expected_string(layout, mesh.names)
        body.append("  using L%d = %s;" % (k, spelling))
        body.append('  using X%d = zest::tensor<%s, %s, "%s", L%d>;' % (k, ctype, mesh.alias, dims, k))
        body.append('  ZEST_STRESS_STATIC_ASSERT(zest::parse_layout("%s", %s::axis_names) == X%d::layout);'
                    % (expected, mesh.alias, k))
        body.append('  static constexpr stress::type_info i%d{R"~(tensor<%s, %s, "%s", %s>)~", "%s", "%s",'
                    ' zest::layout_value_of<%s, "%s", L%d>};'
                    % (k, ctype, mesh.spelling, dims, spelling, expected, layout_code(layout),
                       mesh.alias, dims, k))
        return k

    def make_input(self, body, k, element, extents, salt, layout):
        """Creates t<k> of type X<k> and its reference r<k>; returns the partial axes whose
        summands are arbitrary (their blocks cannot be checked one by one)."""
        body.append("  const X%d::extents_type e%d{%s};" % (k, k, ", ".join(map(str, extents))))
        body.append("  const stress::reference r%d = stress::global_values(e%d, %d);" % (k, k, salt))
        how = self.rng.choice(["generate", "generate", "from_global", "summands"])
        if how == "generate":
            body.append("  auto t%d = stress::make_generated<X%d>(m, e%d, %d);" % (k, k, k, salt))
            arbitrary = set()
        elif how == "from_global":
            self.features.add("input from_global")
            body.append("  auto t%d = stress::make_from_global<X%d>(m, e%d, r%d);" % (k, k, k, k))
            arbitrary = set()
        else:
            self.features.add("input summands")
            body.append("  auto t%d = stress::make_summands<X%d>(m, e%d, r%d, i%d);" % (k, k, k, k, k))
            arbitrary = partial_axes(layout)
        self.check(body, k, "r%d" % k, "0", arbitrary)
        return arbitrary

    def check(self, body, k, ref, tol, arbitrary):
        known = "sums_only" if arbitrary else "values"
        body.append("  stress::check_tensor(t%d, i%d, %s, %s, stress::blocks_known::%s);" % (k, k, ref, tol, known))

    def redistribute(self, body, mesh, element, dims, src_k, src_layout, arbitrary, ref, tol, move,
                     respell=False):
        """t<new> = redistribute<L<new>>(t<src>) to a random layout (or the same one spelled
        anew); returns (k, layout, arbitrary partial axes)."""
        p = self.profile
        if respell and src_layout is not None:
            layout = src_layout
        else:
            layout = random_layout(self.rng, len(mesh.names), dims, p["split"], p["partial"])
        k = self.declare(body, mesh, element, dims, layout)
        source = "std::move(t%d)" % src_k if move else "t%d" % src_k
        self.features.add("redistribute")
        if move:
            self.features.add("redistribute from an rvalue")
        if src_layout == layout:
            self.features.add("same layout respelled")
        body.append("  auto t%d = zest::redistribute<L%d>(%s);" % (k, k, source))
        body.append("  ZEST_STRESS_STATIC_ASSERT(std::is_same_v<decltype(t%d), X%d>);" % (k, k))
        if src_layout is not None:
            self.plans.add((src_layout, layout))
            arbitrary = arbitrary & partial_axes(layout)
        else:
            # The source's layout was deduced: assume every partial axis kept is arbitrary.
            arbitrary = partial_axes(layout)
        self.check(body, k, ref, tol, arbitrary)
        return k, layout, arbitrary

    # --- scenario kinds

    def chain(self):
        """An input, then 1 to 4 redistributes, each checked."""
        p = self.profile
        mesh = self.rng.choice(self.meshes)
        element = self.first_elements.pop() if self.first_elements else self.pick(p["types"])
        dims = self.first_dims.pop() if self.first_dims else self.rng.choice(self.dims_pool)
        ext = self.extents(len(dims), 3000)
        layout = random_layout(self.rng, len(mesh.names), dims, p["split"], p["partial"])
        body = []
        k = self.declare(body, mesh, element, dims, layout)
        arbitrary = self.make_input(body, k, element, ext, self.rng.randrange(100), layout)
        ref = "r%d" % k
        steps = self.rng.randint(1, 4)
        for s in range(steps):
            move = s == steps - 1 and self.rng.random() < 0.3
            respell = self.rng.random() < 0.1
            k, layout, arbitrary = self.redistribute(body, mesh, element, dims, k, layout, arbitrary,
                                                      ref, "0", move, respell)
        comment = "%s \"%s\" %s, %d redistributes" % (ELEMENT_TYPES[element], dims, "x".join(map(str, ext)), steps)
        self.add("chain", mesh, element, comment, body)

    def einsum(self, operands, fixed=None):
        """An einsum of one or two operands with a forced (mostly) or deduced output layout,
        then maybe a redistribute of the result."""
        p = self.profile
        rng = self.rng
        if fixed is not None:
            mesh, element, terms, out, ext_of, layouts, forced = fixed
        else:
            mesh = rng.choice(self.meshes)
            element = self.pick({t: w for t, w in p["types"].items() if t in EINSUM_TYPES})
            # Operands and output are dims strings of the file's pool where that works:
            # terms share letters because the pool draws from a small alphabet.
            if operands == 1:
                a = rng.choice([d for d in self.dims_pool if len(d) >= 2])
                terms = [a]
            else:
                a = rng.choice(self.dims_pool)
                partners = [d for d in self.dims_pool if set(d) & set(a) and len(set(d) | set(a)) <= 6]
                terms = [a, rng.choice(partners)]
            pool = "".join(dict.fromkeys("".join(terms)))  # the letters, in order of appearance
            outs = [d for d in self.dims_pool if set(d) <= set(pool) and len(d) <= 3]
            if outs and rng.random() < 0.7:
                out = rng.choice(outs)
            else:
                out = "".join(rng.sample(pool, rng.randint(1, min(3, len(pool)))))
            while True:
                ext_of = {c: rng.choice(EXTENTS) for c in pool}
                total = 1
                for c in pool:
                    total *= ext_of[c]
                if total <= 4000:
                    break
            layouts = []
            used_partial = set()
            for t in terms:
                lay = random_layout(rng, len(mesh.names), t, p["split"], p["partial"], no_partial=used_partial)
                used_partial |= partial_axes(lay)
                layouts.append(lay)
            forced = (random_layout(rng, len(mesh.names), out, p["split"], p["partial"])
                      if rng.random() < 0.8 else None)
        spec = "%s->%s" % (",".join(terms), out)
        self.note_extents([ext_of[c] for c in sorted(ext_of)])
        summed = set("".join(terms)) - set(out)
        if len(terms) == 2 and summed:
            self.features.add("einsum contraction")
        if len(terms) == 1 and summed:
            self.features.add("einsum reduction")
        if forced is None:
            self.features.add("einsum deduced output")
        elif partial_axes(forced):
            self.features.add("einsum forced partial output")
        body = []
        ks = []
        for t, lay in zip(terms, layouts):
            k = self.declare(body, mesh, element, t, lay)
            self.make_input(body, k, element, [ext_of[c] for c in t], rng.randrange(100), lay)
            ks.append(k)
        args = ", ".join("t%d" % k for k in ks)
        refs = ", ".join("&r%d" % k for k in ks)
        tol = "stress::rounding_tolerance<%s>()" % ELEMENT_TYPES[element]
        if forced is not None:
            k = self.declare(body, mesh, element, out, forced)
            body.append('  auto t%d = zest::einsum<"%s", L%d>(%s);' % (k, spec, k, args))
            body.append("  ZEST_STRESS_STATIC_ASSERT(std::is_same_v<decltype(t%d), X%d>);" % (k, k))
        else:
            k = self.count
            body.append('  auto t%d = zest::einsum<"%s">(%s);' % (k, spec, args))
            k = self.declare(body, mesh, element, out, None, deduced_from="t%d" % k)
        body.append('  const stress::reference r%d = stress::host_einsum("%s", {%s});' % (k, spec, refs))
        # Partial sums of a contraction are arbitrary summands.
        arbitrary = partial_axes(forced) if forced is not None else set(range(len(mesh.names)))
        self.check(body, k, "r%d" % k, tol, arbitrary)
        self.einsums += 1
        if fixed is None and rng.random() < 0.4:
            self.redistribute(body, mesh, element, out, k, forced, arbitrary, "r%d" % k, tol, rng.random() < 0.5)
        kind = "unary" if operands == 1 else "binary"
        comment = 'einsum<"%s"%s> on %s' % (spec, "" if forced is not None else ", deduced", ELEMENT_TYPES[element])
        self.add(kind, mesh, element, comment, body)

    def bug_scenario(self):
        """bug.cpp: Jg split over x and z, einsum Jg->g forced partial<"x">, then a
        replicated "v" whose layout read "split( " at run time with g++ 12."""
        mesh = next(m for m in self.meshes if m.names == BUG_MESH)
        jg = (("s", "g", 0), ("r",), ("s", "J", 0))
        self.einsum(1, fixed=(mesh, "float", ["Jg"], "g", {"J": 4, "g": 8}, [jg], (("p",), ("r",), ("r",))))
        body = []
        k = self.declare(body, mesh, "float", "v", (("r",), ("r",), ("r",)))
        self.make_input(body, k, "float", [4], 1, (("r",),) * 3)
        self.add("bug", mesh, "float", 'bug.cpp\'s replicated "v" after it', body)

    def add(self, kind, mesh, element, comment, body):
        self.scenarios.append(dict(kind=kind, mesh=mesh, element=element, comment=comment, body=body,
                                   serial=len(self.scenarios)))

    # --- the file

    def build(self):
        p = self.profile
        self.bug_scenario()
        bug = self.scenarios[:]
        self.scenarios = []
        while len(self.types) < self.min_types or not self.REQUIRED <= self.features:
            if len(self.types) > 3 * self.min_types:
                raise SystemExit("generate.py: file %d does not cover %s"
                                 % (self.index, ", ".join(sorted(self.REQUIRED - self.features))))
            kind = self.pick(p["kinds"])
            if kind == "chain":
                self.chain()
            else:
                self.einsum(1 if kind == "unary" else 2)
        order = p["order"]
        s = self.scenarios
        if order == "by_type":
            s.sort(key=lambda x: (list(ELEMENT_TYPES).index(x["element"]) if x["element"] != "bf16" else -1, x["serial"]))
        elif order == "by_mesh":
            s.sort(key=lambda x: (-len(x["mesh"].names), x["serial"]))
        elif order == "einsum_first":
            s.sort(key=lambda x: (x["kind"] == "chain", x["serial"]))
        elif order == "reverse":
            s.reverse()
        if p["bug_at"] == "first":
            s[:0] = bug
        elif p["bug_at"] == "last":
            s.extend(bug)
        else:
            s[len(s) // 2:len(s) // 2] = bug

    def write(self, out):
        name = "layout_stress_%d" % self.index
        w = out.append
        w("// %s.cpp: generated by tests/layout_stress/generate.py --file %d; do not edit." % (name, self.index))
        w("// %d distinct tensor types, %d distinct transition plans, %d einsums, %d scenarios over"
          % (len(self.types), len(self.plans), self.einsums, len(self.scenarios)))
        w("// meshes %s." % ", ".join(m.spelling for m in self.meshes))
        w("// Covers: %s." % ", ".join(sorted(self.features)))
        w('#include "stress_support.hpp"')
        w("")
        w("#ifndef ZEST_STRESS_OPT")
        w('#define ZEST_STRESS_OPT "?"')
        w("#endif")
        w("")
        w("namespace {")
        for m in self.meshes:
            w("using %s = %s;" % (m.alias, m.spelling))
        w("")
        for i, s in enumerate(self.scenarios):
            s["function"] = "s%d" % i
            w("// %s: %s" % (s["function"], s["comment"]))
            w("void %s(const %s& m) {" % (s["function"], s["mesh"].alias))
            out.extend(s["body"])
            w("}")
            w("")
        w("}  // namespace")
        w("")
        w("int main(int argc, char** argv) {")
        w("  zest::mpi_environment mpi(&argc, &argv);")
        for m in self.meshes:
            shapes = ", ".join("{%s}" % ", ".join(map(str, sh)) for sh in m.shapes)
            w("  const auto m%d = stress::meshes<%s, %d>({%s});" % (m.index, m.alias, len(m.names), shapes))
        for s in self.scenarios:
            w('  stress::run("%s", m%d, %s);' % (s["function"], s["mesh"].index, s["function"]))
        w('  return stress::finish("%s", ZEST_STRESS_OPT, %d, %d, %d);' % (name, len(self.types), len(self.plans), self.einsums))
        w("}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=int, required=True, help="which file (its profile: index mod %d)" % len(PROFILES))
    parser.add_argument("--output", required=True)
    parser.add_argument("--seed", type=int, default=10, help="the random stream's seed (with --file)")
    parser.add_argument("--min-types", type=int, default=200, help="distinct tensor types per file, at least")
    args = parser.parse_args()
    writer = FileWriter(args.file, args.seed, args.min_types)
    writer.build()
    lines = []
    writer.write(lines)
    text = "\n".join(lines) + "\n"
    try:
        with open(args.output, encoding="utf-8") as f:
            if f.read() == text:
                return  # unchanged: keep the timestamp, no rebuild
    except OSError:
        pass
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
