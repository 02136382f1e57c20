"""Kubernetes manifests of a topology (`lab render k8s`).

The containers' command lines are the launcher's (`launch.commands`), so a manifest runs what
`lab up` runs. `objects.py` builds plain Kubernetes objects (dicts); `lab_stack.py` and
`dynamo_stack.py` arrange them, with `etcd.py` for discovery and `client_job.py` for the load
client; `render.py` writes them; `validate.py` checks them offline against the Kubernetes JSON
schemas (the `k8s` extra); `cli.py` is the command. See docs/kubernetes.md.
"""
