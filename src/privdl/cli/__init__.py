"""privdl command-line interface."""
