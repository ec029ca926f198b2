"""The suite's support package, loaded once through ``pytest_plugins`` in tests/conftest.py:
servers and fresh databases, backend fixtures, process helpers and the one ``wait_until``."""
