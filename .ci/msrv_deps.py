"""Every package the library builds with (normal and build dependencies,
all features, as Cargo.lock resolves them) declares a rust-version no newer
than the crate's own claim. Usage: cargo metadata --format-version 1
--all-features --locked | python3 .ci/msrv_deps.py"""
import json
import sys


def version(v):
    """`1.85` and `1.85.0` are the same version: pad to three parts."""
    parts = [int(p) for p in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
root = meta["resolve"]["root"]
claim = packages[root]["rust_version"]
if not claim:
    sys.exit("Cargo.toml claims no rust-version")

seen, todo = set(), [root]
while todo:
    node = nodes[todo.pop()]
    for dep in node["deps"]:
        kinds = {k["kind"] for k in dep["dep_kinds"]}
        if kinds - {"dev"} and dep["pkg"] not in seen:
            seen.add(dep["pkg"])
            todo.append(dep["pkg"])

bad = []
for pid in sorted(seen, key=lambda i: packages[i]["name"]):
    p = packages[pid]
    needs = p.get("rust_version")
    print(f"  {p['name']} {p['version']}: rust-version {needs or '(none declared)'}")
    if needs and version(needs) > version(claim):
        bad.append(f"{p['name']} {p['version']} needs {needs}")
if bad:
    sys.exit(f"dependencies newer than rust-version {claim}: " + ", ".join(bad))
print(f"{len(seen)} dependencies, none needs more than Rust {claim}")
