"""Optional integrations with other federated-learning frameworks.

Each submodule imports its framework lazily: ``import privdl`` never needs them. Install the
extras with ``pip install "privdl[flower]"``.
"""
