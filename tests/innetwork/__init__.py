"""Tests of tailcut.innetwork and the ToR kinds' registry."""
