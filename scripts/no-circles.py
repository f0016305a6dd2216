#!/usr/bin/env python3
"""No two files of the runtime import each other: lists the pairs of files under
crates/topspin/src (other than unit-test files) where each names the other by path
(`crate::…`, `super::…`, `self::…`, `use super::{…}`), and exits 1 if there is one. A parent
module and its own child files may use each other (that is one module split in files)."""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "topspin", "src")


def module_path(rel: str) -> tuple:
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def load() -> dict:
    files = {}
    for dirpath, _, names in os.walk(ROOT):
        for name in names:
            if not name.endswith(".rs") or name == "tests.rs" or name.endswith("_tests.rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
            with open(os.path.join(dirpath, name)) as f:
                src = f.read()
            src = re.split(r"#\[cfg\(test\)\]\s*mod tests\s*\{", src)[0]
            files[rel] = re.sub(r"//.*", "", src)
    return files


def resolve(modules: dict, current: str, segs: list):
    """The file that a path's longest known prefix names."""
    if segs[0] == "crate":
        path, segs = [], segs[1:]
    else:
        path = list(module_path(current))
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                path = path[:-1]
            segs = segs[1:]
    best = modules.get(tuple(path))
    for s in segs:
        path.append(s)
        if tuple(path) not in modules:
            break
        best = modules[tuple(path)]
    return best


def deps_of(files: dict) -> dict:
    modules = {module_path(rel): rel for rel in files}
    deps = {rel: set() for rel in files}
    for rel, src in files.items():
        for m in re.finditer(r"\b((?:crate|super|self)(?:::(?:super|[A-Za-z_]\w*))+)", src):
            deps[rel].add(resolve(modules, rel, m.group(1).split("::")))
        for m in re.finditer(r"\b(crate|super)((?:::[a-z_]\w*)*)::\{([^}]*)\}", src):
            prefix = [m.group(1)] + [x for x in m.group(2).split("::") if x]
            for item in m.group(3).split(","):
                item = item.strip().split("::")[0]
                if item:
                    deps[rel].add(resolve(modules, rel, prefix + [item]))
        deps[rel].discard(None)
        deps[rel].discard(rel)
    return deps


def is_parent(a: str, b: str) -> bool:
    pa, pb = module_path(a), module_path(b)
    return pb[: len(pa)] == pa or pa[: len(pb)] == pb


def main() -> int:
    deps = deps_of(load())
    pairs = sorted(
        {tuple(sorted((a, b))) for a in deps for b in deps[a] if a in deps.get(b, ()) and not is_parent(a, b)}
    )
    for a, b in pairs:
        print(f"crates/topspin/src/{a} <-> crates/topspin/src/{b}: they import each other")
    return 1 if pairs else 0


if __name__ == "__main__":
    sys.exit(main())
