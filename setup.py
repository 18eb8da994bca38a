"""Only what pyproject.toml cannot say (everything else is there): the packages.

tailcut.ebpf's files live in ebpf/ at the top level (package-dir in pyproject.toml), and
[tool.setuptools.packages.find] finds packages only where they sit in the tree, so the
list is the tailcut* packages found under tailcut/ plus tailcut.ebpf."""

from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["tailcut*"]), "tailcut.ebpf"])
