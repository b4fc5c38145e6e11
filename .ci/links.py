"""Every relative link in the Markdown files that `cargo package` ships
points at a file it ships too, so that readers of the published crate
(crates.io, docs.rs, a vendored copy) find no dead link.

Reads the package's file list on stdin (`cargo package --list`).
"""
import os
import re
import sys

shipped = {line.strip() for line in sys.stdin if line.strip()}
link = re.compile(r"\]\(([^)\s]+)\)")
dead = []
for path in sorted(p for p in shipped if p.endswith(".md")):
    base = os.path.dirname(path)
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            for target in link.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue
                file = os.path.normpath(os.path.join(base, target.split("#")[0]))
                if file not in shipped:
                    dead.append(f"{path}:{n}: {target} (not in the package)")
if dead:
    print("links the published crate cannot follow:", *dead, sep="\n  ", file=sys.stderr)
    sys.exit(1)
print(f"relative links in {sum(p.endswith('.md') for p in shipped)} shipped Markdown files: all shipped")
