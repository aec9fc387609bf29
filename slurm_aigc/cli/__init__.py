"""Command-line interface: thin click commands over the library; one module per area."""
