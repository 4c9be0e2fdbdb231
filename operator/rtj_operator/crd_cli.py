"""`rtj crd`: print the CustomResourceDefinition generated from rtj_operator.api, or write it to crds/.

`make crds` runs `rtj crd --write` from the repository root: it writes the CRD to crds/ and the user's
field reference, rendered from the same schema, to docs/api.md. Tests keep both equal to what the
models generate (and the Helm chart's copy is synced from crds/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rtj_operator import api, constants

CRD_FILENAME = f"{constants.GROUP}_{constants.PLURAL}.yaml"
REFERENCE_PATH = Path("docs") / "api.md"


def _type_text(node: dict[str, Any]) -> str:
    kind = str(node.get("type", "object"))
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    if kind == "array":
        return f"[]{_type_text(node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type_text(node['additionalProperties'])}"
    if kind == "integer":
        return str(node.get("format", "integer"))
    if kind == "string" and node.get("format") == "date-time":
        return "date-time"
    return "object" if kind == "object" else kind


def _limits_text(node: dict[str, Any]) -> str:
    parts = []
    for key, text in (("minimum", ">= {}"), ("maximum", "<= {}"), ("minItems", "at least {} item(s)"),
                      ("maxItems", "at most {} item(s)"), ("maxLength", "at most {} characters"),
                      ("maxProperties", "at most {} entries"), ("pattern", "matches `{}`")):  # fmt: skip
        if key in node:
            parts.append(text.format(node[key]))
    # A list's items and a map's values have limits of their own (a label value's pattern, an arg's length).
    for key, label in (("items", "each item"), ("additionalProperties", "each value")):
        inner = node.get(key)
        if isinstance(inner, dict) and not inner.get("properties") and _limits_text(inner):
            parts.append(f"{label}: {_limits_text(inner).replace('; ', ', ')}")
    return "; ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _object_sections(node: dict[str, Any], path: str, out: list[str]) -> None:
    """One section per object: a table of its fields, its rules, then its nested objects."""
    properties: dict[str, Any] = node.get("properties", {})
    required = set(node.get("required", []))
    out += [f"### `{path}`", "", "| field | type | required | default | constraints | description |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    nested: list[tuple[str, dict[str, Any]]] = []
    for key, sub in properties.items():
        default = f"`{json.dumps(sub['default'])}`" if "default" in sub else ""
        out.append(
            f"| `{key}` | {_type_text(sub)} | {'yes' if key in required else ''} | {_cell(default)} | "
            f"{_cell(_limits_text(sub))} | {_cell(sub.get('description', ''))} |"
        )
        target = sub["items"] if sub.get("type") == "array" and isinstance(sub.get("items"), dict) else sub
        if target.get("properties"):
            nested.append((f"{path}.{key}" + ("[]" if target is not sub else ""), target))
    rules = [r for sub in properties.values() for r in sub.get("x-kubernetes-validations", [])]
    rules = node.get("x-kubernetes-validations", []) + rules
    if rules:
        out += ["", "Rules (checked by the API server as CEL and by the operator in Python):", ""]
        out += [f"- `{rule['rule']}`: {rule['message']}" for rule in rules]
    out.append("")
    for sub_path, sub in nested:
        _object_sections(sub, sub_path, out)


def reference_markdown(crd: dict[str, Any] | None = None) -> str:
    """docs/api.md: the spec and status fields of the CRD as tables, generated from its schema."""
    crd = crd if crd is not None else api.crd()
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    out = [
        "<!-- Generated from rtj_operator.api by `rtj crd --write`; do not edit. -->",
        f"# {constants.KIND} API reference (`{constants.API_VERSION}`)",
        "",
        schema["description"],
        "",
        f"Short name `{constants.SHORT_NAMES[0]}`, plural `{constants.PLURAL}`, category "
        f"`{constants.CATEGORIES[0]}`. The job's name must be a DNS label of at most "
        f"{api.MAX_JOB_NAME_LENGTH} characters (it prefixes the pods' hostnames). Examples: `examples/`; "
        "`rtj render -f job.yaml` prints the objects the operator creates for a job.",
        "",
        "Every limit and rule below is checked twice, by the same declarations: by the API server (the "
        "CRD's schema and CEL rules) when a job is applied, and by `rtj render` and the operator. The "
        "Kubernetes types a spec embeds (env, volumes and mounts, tolerations, node selector and affinity "
        "terms, quantities, names) follow the rules the API server applies to the pods and claims they "
        "become, so an accepted job never yields a child the API server refuses.",
        "",
        "## Printer columns",
        "",
        "| column | type | source |",
        "|---|---|---|",
        *[f"| {c['name']} | {c['type']} | `{c['jsonPath']}` |" for c in version["additionalPrinterColumns"]],
        "",
        "## Spec",
        "",
    ]
    _object_sections(schema["properties"]["spec"], "spec", out)
    out += ["## Status", "", "Written by the operator through the status subresource.", ""]
    _object_sections(schema["properties"]["status"], "status", out)
    return "\n".join(out).rstrip("\n") + "\n"


def _write(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and target.read_text(encoding="utf-8") == text:
        print(f"{target}: up to date")
        return
    target.write_text(text, encoding="utf-8")
    print(f"{target}: written")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtj crd", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"write crds/{CRD_FILENAME} and {REFERENCE_PATH} under --root instead of printing the CRD",
    )
    parser.add_argument("--root", default=".", help="the repository root for --write (default: .)")
    args = parser.parse_args(argv)
    text = api.crd_yaml()
    if not args.write:
        sys.stdout.write(text)
        return 0
    _write(Path(args.root) / "crds" / CRD_FILENAME, text)
    _write(Path(args.root) / REFERENCE_PATH, reference_markdown())
    return 0
