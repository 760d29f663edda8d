"""Helpers shared by the test suites: paths, launcher environments, Hydra composition."""
