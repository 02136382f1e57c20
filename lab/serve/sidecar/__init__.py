"""The sidecar: one per engine; openengine.v1 on one side, the request plane on the other."""
