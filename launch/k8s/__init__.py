"""Kubernetes manifests of a topology (`lab render k8s`).

The containers' command lines are the launcher's (`launch.commands`), so a manifest runs what
`lab up` runs; `objects.py` builds plain Kubernetes objects (dicts), `lab_stack.py` and
`dynamo_stack.py` arrange them, `render.py` writes them, `validate.py` checks them offline
against the Kubernetes JSON schemas (the `k8s` extra). See docs/kubernetes.md.
"""
