"""The ``fedge`` command line (the app is :data:`fedge.cli.main.app`); it only parses and calls."""
