"""Tests of tailcut.transports."""
