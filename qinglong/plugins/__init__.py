"""Built-in plugins. Each subpackage is loaded by the host only through its entry point."""
