"""What the launcher and every process it starts agree on: the layer below `lab` and `launch`.

The serving-path defaults (`settings`), the on/off switches of the command lines (`switches`),
the HuggingFace tokenizer loader (`hf_tokenizer`) and the parent-death helper (`pdeath`).
It imports nothing of ours but `lab.wire`, so `lab.serve`, `lab.load`, the `lab` commands and
`launch` can all build on it while `launch` never reaches up into `lab` (tests/test_layers.py).
"""
