pytest_plugins = ["bench.plugin"]
