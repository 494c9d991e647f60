#!/usr/bin/env python3
"""Checks the house rules the code review asks for, on Rust sources:

- no file over MAX_FILE lines (default 600);
- no function over MAX_FN lines (default 120), counted from its `fn` line to its
  closing brace;
- no import circles between the modules of a crate: module A imports B when its code
  (not its comments or its `#[cfg(test)] mod tests`) names a path into B (`use` or
  inline: `crate::b::..`, `super::b::..`, a child `b::..`); a parent that uses its child
  and a child that uses its parent make a circle too. `mod x;` declarations are not
  imports.

    scripts/check-structure.py [CRATE_DIR ...]     (default: every crate of the workspace)

Prints what it finds and exits 1 if anything breaks a rule.
"""
import os
import re
import sys

MAX_FILE = int(os.environ.get("MAX_FILE", 600))
MAX_FN = int(os.environ.get("MAX_FN", 120))

FN_RE = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")
PATH_RE = re.compile(r"(?<![\w$:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_RE = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?use\s+([^;]+);", re.S)


def strip_comments_and_strings(text):
    """Drops comments and the contents of string and char literals."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == '"' or (c == "r" and re.match(r'r#*"', text[i:])):
            m = re.match(r'r(#*)"', text[i:])
            if m:
                end = '"' + m.group(1)
                j = text.find(end, i + len(m.group(0)))
                i = n if j < 0 else j + len(end)
            else:
                j = i + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                i = j + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", text[i:]).group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def without_tests(text):
    m = re.search(r"#\[cfg\(test\)\]\s*mod\s+tests\s*\{", text)
    return text[: m.start()] if m else text


def crate_modules(src):
    """Module path (tuple) -> file, for every .rs file under a crate's src."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)[:-3].split(os.sep)
            if rel[-1] in ("lib", "main") and len(rel) == 1:
                key = ()
            elif rel[-1] == "mod":
                key = tuple(rel[:-1])
            else:
                key = tuple(rel)
            if f == "tests.rs" or "tests" in rel[:-1]:
                continue  # test modules may use their parent freely
            if f == "main.rs" and len(rel) == 1 and () in mods:
                key = ("<bin>",)
            mods[key] = path
    return mods


def expand_use(tree):
    """`a::{b, c::{d}}` -> [a::b, a::c::d]."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)::\{(.*)\}$", tree)
    if not m:
        return [re.sub(r"as\w+$", "", tree.split(" as ")[0])]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    if cur:
        parts.append(cur)
    out = []
    for p in parts:
        out += [prefix + "::" + q for q in expand_use(p)]
    return out


def resolve(module, path, mods):
    segs = [s for s in path.split("::") if s]
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(module)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    elif tuple(module) + (segs[0],) in mods:
        base = list(module)
    else:
        return None  # an external crate or std
    target = tuple(base)
    for s in segs:
        if target + (s,) in mods:
            target = target + (s,)
        else:
            break
    return target if target in mods else None


def cycles(graph):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                out.append(comp)

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def is_declaration(lines, i):
    """Whether the `fn` at line i has no body (an `extern` block's declaration, a trait
    method without a default): its signature, over one or more lines, ends with `;`
    before any `{`."""
    for line in lines[i:]:
        code = line.split("//")[0].rstrip()
        if "{" in code:
            return False
        if code.endswith(";"):
            return True
    return False


def check_crate(crate_dir):
    problems = []
    src = os.path.join(crate_dir, "src")
    files = []
    for top in ("src", "tests", "benches", "examples"):
        for dirpath, _, fs in os.walk(os.path.join(crate_dir, top)):
            files += [os.path.join(dirpath, f) for f in fs if f.endswith(".rs")]
    for path in sorted(files):
        lines = open(path, encoding="utf-8").read().split("\n")
        if len(lines) - 1 > MAX_FILE:
            problems.append(f"{path}: {len(lines) - 1} lines (more than {MAX_FILE})")
        for i, line in enumerate(lines):
            m = FN_RE.match(line)
            if not m or is_declaration(lines, i):
                continue
            indent = m.group(1)
            for j in range(i + 1, len(lines)):
                if lines[j] == indent + "}":
                    if j - i + 1 > MAX_FN:
                        problems.append(f"{path}:{i + 1}: fn {m.group(7)} is {j - i + 1} lines (more than {MAX_FN})")
                    break
    if not os.path.isdir(src):
        return problems
    mods = crate_modules(src)
    graph = {}
    for module, path in mods.items():
        code = strip_comments_and_strings(without_tests(open(path, encoding="utf-8").read()))
        code = re.sub(r"^\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*;", "", code, flags=re.M)
        paths = []
        for m in USE_RE.finditer(code):
            paths += expand_use(m.group(3))
        code_wo_use = USE_RE.sub("", code)
        paths += PATH_RE.findall(code_wo_use)
        for p in paths:
            t = resolve(module, p, mods)
            if t is not None and t != module:
                graph.setdefault(module, set()).add(t)
    for comp in cycles(graph):
        names = ", ".join(mods[m] for m in comp)
        problems.append(f"import circle: {names}")
    return problems


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    crates = argv or [root] + [
        os.path.join(root, d)
        for d in ("analysis", "crates/trace-format", "crates/trace-recorder")
        if os.path.isdir(os.path.join(root, d))
    ]
    problems = []
    for c in crates:
        problems += check_crate(c)
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s) in {len(crates)} crate(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
