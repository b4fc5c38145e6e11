"""For each package of the workspace (the core, worker-relay-hyper, the
kit, the CLI): every package it builds with (normal and build
dependencies, all features, as Cargo.lock resolves them) declares a
rust-version no newer than the package's own claim. Usage: cargo metadata
--format-version 1 --all-features --locked | python3 .ci/msrv_deps.py
[--only NAME | --except NAME]... (which workspace packages to check; all
by default)."""
import json
import sys


def version(v):
    """`1.85` and `1.85.0` are the same version: pad to three parts."""
    parts = [int(p) for p in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}


def check(member):
    """The member's non-dev dependencies, walked to the leaves: a list of
    those that need a newer Rust than the member claims."""
    claim = packages[member]["rust_version"]
    name = packages[member]["name"]
    if not claim:
        sys.exit(f"{name}: Cargo.toml claims no rust-version")
    seen, todo = set(), [member]
    while todo:
        node = nodes[todo.pop()]
        for dep in node["deps"]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            if kinds - {"dev"} and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    bad = []
    print(f"{name} (rust-version {claim}):")
    for pid in sorted(seen, key=lambda i: packages[i]["name"]):
        p = packages[pid]
        needs = p.get("rust_version")
        print(f"  {p['name']} {p['version']}: rust-version {needs or '(none declared)'}")
        if needs and version(needs) > version(claim):
            bad.append(f"{name}: {p['name']} {p['version']} needs {needs} (claim {claim})")
    print(f"  {len(seen)} dependencies, {len(bad)} need more than Rust {claim}")
    return bad


only, skip = set(), set()
args = sys.argv[1:]
while args:
    flag, name, args = args[0], args[1], args[2:]
    {"--only": only, "--except": skip}[flag].add(name)


def chosen(member):
    name = packages[member]["name"]
    return (not only or name in only) and name not in skip


# Each package of the workspace against its own claim.
bad = [b for m in meta["workspace_members"] if chosen(m) for b in check(m)]
if bad:
    sys.exit("dependencies newer than their package's rust-version: " + "; ".join(bad))
