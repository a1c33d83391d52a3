"""The repository files deploy/k8s generates ConfigMaps from, copied into it (`make k8s-copies`).

kustomize's default load restrictor (that of `kubectl apply -k`, Argo CD and Flux) reads no
file outside the kustomization that names it, so each kustomization holds its own copy of
the site configs, prompts and NATS server config it turns into ConfigMaps, under
`from-repo/` at the file's path in the repository: `from-repo/sites/demo.toml` is a copy of
`sites/demo.toml`. This writes every copy a kustomization names from its source;
`--check` only lists those that differ (tests/test_k8s.py fails on any).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

K8S = Path(__file__).resolve().parent
REPO = K8S.parent.parent
MARK = "from-repo"


def copies() -> list[tuple[Path, Path]]:
    """(copy, source) for every `from-repo/` file a kustomization's generators name."""
    found = []
    for kustomization in sorted(K8S.rglob("kustomization.yaml")):
        spec = yaml.safe_load(kustomization.read_text())
        for generator in spec.get("configMapGenerator", []) + spec.get("secretGenerator", []):
            for entry in generator.get("files", []):
                name = entry.split("=", 1)[-1]
                copy = (kustomization.parent / name).resolve()
                parts = copy.relative_to(K8S).parts
                if MARK in parts:
                    found.append((copy, REPO.joinpath(*parts[parts.index(MARK) + 1:])))
    return found


def stale() -> list[str]:
    """The copies that differ from their sources (or are missing), as repo-relative paths."""
    return [str(copy.relative_to(REPO)) for copy, source in copies()
            if not copy.exists() or copy.read_bytes() != source.read_bytes()]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        for path in stale():
            print(f"{path} differs from its source: make k8s-copies")
        return 1 if stale() else 0
    for copy, source in copies():
        copy.parent.mkdir(parents=True, exist_ok=True)
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            copy.write_bytes(source.read_bytes())
            print(f"copied {source.relative_to(REPO)} -> {copy.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
