"""Tests of tailcut.training."""
