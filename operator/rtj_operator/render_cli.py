"""`rtj render`: print the Kubernetes objects the operator would create for a ResilientTrainingJob.

It reads one or more job manifests (YAML or JSON; `-` for stdin), validates each with
:func:`rtj_operator.api.parse_job` and prints :func:`rtj_operator.render.render`'s output as multi-document
YAML or a JSON ``List``. An invalid job exits with status 2 and one line per offending field, named by
its path; nothing is contacted, so the output is what the operator renders before the API server
fills in server-side fields.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

import yaml

from rtj_operator import api, constants, render

# Without a real uid (the API server assigns it) the owner references get a stable stand-in, so that
# rendering the same file twice prints the same bytes.
_UID_NAMESPACE = uuid.UUID("5b2b1c4e-6a55-4b8e-9a5e-1f0d2c3b4a59")


def placeholder_uid(namespace: str, name: str) -> str:
    """A deterministic stand-in uid for a job that has not been created yet."""
    return str(uuid.uuid5(_UID_NAMESPACE, f"{namespace}/{name}"))


def _fail(message: str) -> int:
    print(f"rtj render: {message}", file=sys.stderr)
    return 2


def _read_documents(path: str) -> list[Any]:
    if path == "-":
        text = sys.stdin.read()
    else:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def _render_document(doc: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    if not isinstance(doc, dict):
        raise api.JobValidationError([("", "a job manifest must be a mapping")])
    if doc.get("kind") != constants.KIND:
        raise api.JobValidationError([("kind", f"expected {constants.KIND}, got {doc.get('kind')!r}")])
    metadata = dict(doc.get("metadata") or {})
    if args.namespace:
        if metadata.get("namespace") not in (None, args.namespace):
            raise api.JobValidationError(
                [
                    (
                        "metadata.namespace",
                        f"{metadata['namespace']!r} differs from --namespace {args.namespace!r}",
                    )
                ]
            )
        metadata["namespace"] = args.namespace
    job = api.parse_job({**doc, "metadata": metadata})
    uid = job.metadata.uid or args.uid or placeholder_uid(job.namespace, job.name)
    return render.render(job, uid=uid, excluded_nodes=args.exclude_node)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtj render", description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--filename", required=True, help="job manifest (YAML or JSON), - for stdin")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    parser.add_argument("-n", "--namespace", help="namespace for jobs that name none (default: default)")
    parser.add_argument(
        "--uid", help="the job's uid for owner references (default: metadata.uid or a stand-in)"
    )
    parser.add_argument(
        "--exclude-node",
        action="append",
        default=[],
        metavar="NODE",
        help="keep pods off this node (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        documents = _read_documents(args.filename)
    except OSError as error:
        return _fail(f"cannot read {args.filename}: {error.strerror or error}")
    except yaml.YAMLError as error:
        return _fail(f"{args.filename}: not valid YAML: {error}")
    if not documents:
        return _fail(f"{args.filename}: no job manifest found")
    objects: list[dict[str, Any]] = []
    for position, doc in enumerate(documents):
        where = args.filename if len(documents) == 1 else f"{args.filename} (document {position + 1})"
        try:
            objects += _render_document(doc, args)
        except api.JobValidationError as error:
            lines = "\n".join(
                f"  {path}: {message}" if path else f"  {message}" for path, message in error.problems
            )
            return _fail(f"{where}: invalid {constants.KIND}:\n{lines}")
    if args.output == "json":
        sys.stdout.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=120, explicit_start=True))
    return 0
