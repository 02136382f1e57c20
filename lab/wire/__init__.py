"""Wire contracts shared by every process: generated gRPC code (`lab.wire.gen`), the constants
of each contract, and the ready-line convention. Imports nothing else from the project."""
