#!/usr/bin/env python3
"""Fails when a crate's modules import each other in a circle.

A crate reads bottom-up when, at every level of its module tree, the sibling modules form a
DAG. For every `crate::a::b` or `super::x` path (and `use crate::{a, b}` groups) in a module
(comments and its `mod tests` left out), the reference is lifted to the two siblings under
the modules' common parent: `x/y` naming `z/w` is an edge `x -> z`; a module naming its own
ancestor or descendant is not. Any strongly connected set of siblings is reported.

Usage: scripts/lib/module-cycles.py [CRATES_DIR]   (default: crates/ beside this script)
"""
import glob
import os
import re
import sys


def module_of(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "/".join(parts)


def code_of(path):
    text = open(path, encoding="utf-8").read()
    cut = text.find("#[cfg(test)]\nmod tests")
    if cut >= 0:
        text = text[:cut]
    return "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))


def references(module, text, modules):
    parent = [p for p in module.split("/")[:-1] if p] if module else []
    found = set()

    def longest(base, names):
        for k in range(len(names), 0, -1):
            cand = "/".join(base + names[:k])
            if cand in modules:
                return cand
        return None

    for kw, base in (("crate", []), ("super", parent)):
        for m in re.finditer(r"\b" + kw + r"::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text):
            hit = longest(base, m.group(1).split("::"))
            if hit:
                found.add(hit)
        for m in re.finditer(r"\b" + kw + r"::\{([^;]*?)\};", text, re.S):
            for item in re.split(r",(?![^{]*\})", m.group(1)):
                name = re.split(r"::|\s|\{", item.strip())[0]
                if name and "/".join(base + [name]) in modules:
                    found.add("/".join(base + [name]))
    found.discard(module)
    return found


def cycles(src):
    files = glob.glob(os.path.join(src, "**", "*.rs"), recursive=True)
    modules = {module_of(src, f): f for f in files}
    edges = {}
    for module, path in modules.items():
        for ref in references(module, code_of(path), modules):
            a = [p for p in module.split("/") if p]
            b = [p for p in ref.split("/") if p]
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            if k in (len(a), len(b)):
                continue  # an ancestor or a descendant
            edges.setdefault("/".join(a[: k + 1]), set()).add("/".join(b[: k + 1]))
    # Tarjan's strongly connected components.
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(100000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "crates")
    bad = 0
    for src in sorted(glob.glob(os.path.join(root, "*", "src"))):
        crate = os.path.basename(os.path.dirname(src))
        for comp in cycles(src):
            bad += 1
            print(f"{crate}: modules import each other in a circle: {' <-> '.join(comp)}")
    if bad:
        print(f"{bad} circle(s); move what they share into a module below them (docs/contributing.md)")
        sys.exit(1)
    print(f"no module circles in {len(glob.glob(os.path.join(root, '*', 'src')))} crates")


if __name__ == "__main__":
    main()
