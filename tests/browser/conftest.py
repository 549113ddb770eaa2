"""The browser test's marker (``make test-browser``; see browser_lab.py for why ``make test`` skips it)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives JupyterLab in headless Chromium (make test-browser)")
