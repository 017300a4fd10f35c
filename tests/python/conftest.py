"""pytest settings for qkv's Python tests (run by ctest: tests/python/CMakeLists.txt).

The module under test is build/python/qkv (PYTHONPATH). Tests marked `serial` measure time
and run in their own ctest entry with RUN_SERIAL, alone on the machine's cores.
"""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "serial: timing-sensitive; run alone (ctest entry python.serial)")
